#!/usr/bin/env bash
# Run the ingest bench on a simulated slow disk: every fsync/fdatasync delayed by
# SLOW_FSYNC_US microseconds (default 4000) through an LD_PRELOAD shim built here.
# Usage: benches/slow-disk/run.sh   (extra env knobs as for `cargo bench --bench ingest`)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/slow-disk
mkdir -p "$out"
cc -O2 -shared -fPIC -o "$out/slow_fsync.so" benches/slow-disk/slow_fsync.c -ldl
cargo bench --bench ingest --no-run
bin=$(cargo bench --bench ingest --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
export SLOW_FSYNC_US="${SLOW_FSYNC_US:-4000}"
echo "simulated flush delay: ${SLOW_FSYNC_US} us per fsync/fdatasync"
LD_PRELOAD="$PWD/$out/slow_fsync.so" "$bin"
