#!/usr/bin/env bash
# End-to-end on a real n8n (on demand; not in the default test run — it installs ~2 GB):
#
#   tests/e2e/n8n.sh
#
# Installs n8n 2.8.4 from the npm registry into a cache dir (DEADLETTER_E2E_CACHE, default
# ~/.cache/deadletter-e2e; reused), starts it on loopback with a throwaway user folder, imports
# the templates from packaging/n8n/ (error workflow, "send to deadletter" sub-workflow, the
# example orders workflow, the ingest-token credential), starts deadletter (release build) with
# an ingest token, makes the example workflow fail (its upstream answers 500), checks the
# failure arrived in deadletter with the webhook item as payload, fixes the upstream, replays the
# record to n8n's webhook with `deadletter replay --wait`, and checks n8n ran it (the upstream got
# the order) and deadletter marked it replayed. Everything listens on 127.0.0.1 and is stopped
# at the end.
set -euo pipefail

here="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${DEADLETTER_E2E_CACHE:-$HOME/.cache/deadletter-e2e}"
n8n_version="2.8.4"
n8n_port="${N8N_E2E_PORT:-5688}"
dl_port="${DL_E2E_PORT:-7688}"
up_port=7690   # the example workflow's upstream (packaging/n8n/example-orders-workflow.json)
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -z "${KEEP:-}" ]; then rm -rf "$work"; else echo "kept $work"; fi
}
trap cleanup EXIT
say() { printf '\n== %s\n' "$*"; }
started=$(date +%s)

install_n8n() {
  local dir="$cache/n8n-$n8n_version"
  if [ -x "$dir/node_modules/.bin/n8n" ]; then
    echo "$dir/node_modules/.bin/n8n"
    return
  fi
  say "installing n8n $n8n_version into $dir (once; about 2 GB)" >&2
  mkdir -p "$dir"
  # xlsx's release points at a tarball outside the registry: pin the registry's 0.18.5.
  cat > "$dir/package.json" <<JSON
{ "name": "deadletter-e2e-n8n", "private": true,
  "dependencies": { "n8n": "$n8n_version" },
  "overrides": { "xlsx": "0.18.5" } }
JSON
  # sqlite3 builds from source when its prebuilt download fails: use the local Node headers.
  (cd "$dir" && npm_config_nodedir=/usr npm install --no-audit --no-fund --loglevel=error >&2)
  echo "$dir/node_modules/.bin/n8n"
}

n8n_bin="$(install_n8n)"
