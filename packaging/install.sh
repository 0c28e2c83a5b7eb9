#!/usr/bin/env bash
# Install deadletter on this machine: build the release binary, install it, and install and
# start the service (a launchd agent on macOS, a systemd user unit on Linux; --system for a
# LaunchDaemon / system unit, as root). The service step writes the default config if there is
# none. Safe to run again: it replaces the binary and the service file, never the config or
# the data.
#
#   packaging/install.sh [--prefix DIR] [--system] [--no-service] [--binary PATH] [--dry-run]
#   packaging/install.sh --uninstall [--prefix DIR] [--system]
#
# --prefix    where bin/deadletter goes (default: /usr/local as root, else ~/.local)
# --binary    install this binary instead of building one
# --no-service  install the binary only (and write the default config if there is none)
# --dry-run   build and install the binary, but only print what the service step would do
# --uninstall stop and remove the service and the binary; the config and the data stay
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
prefix=""
system=""
service=1
binary=""
dry_run=""
uninstall=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --system) system="--system"; shift ;;
    --no-service) service=""; shift ;;
    --binary) binary="$2"; shift 2 ;;
    --dry-run) dry_run="--dry-run"; shift ;;
    --uninstall) uninstall=1; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$prefix" ]; then
  if [ "$(id -u)" = 0 ]; then prefix=/usr/local; else prefix="$HOME/.local"; fi
fi
target="$prefix/bin/deadletter"

if [ -n "$uninstall" ]; then
  if [ -x "$target" ]; then
    # A service that is not installed is fine: there is nothing to stop.
    "$target" service uninstall $system || true
    rm -f "$target"
    echo "removed $target (the config and the data are kept)"
  else
    echo "nothing installed at $target"
  fi
  exit 0
fi

if [ -z "$binary" ]; then
  echo "building the release binary (cargo build --release --locked) ..."
  (cd "$here" && cargo build --release --locked)
  binary="$here/target/release/deadletter"
fi
mkdir -p "$prefix/bin"
if cmp -s "$binary" "$target"; then
  echo "$target is up to date"
else
  # Copy beside it, then rename: a running service keeps its old file until it restarts.
  install -m 0755 "$binary" "$target.new"
  mv -f "$target.new" "$target"
  echo "installed $target ($("$target" --version))"
fi

if [ -n "$service" ]; then
  "$target" service install $system $dry_run
else
  # The config the service would read; written once, never overwritten.
  if [ "$(uname -s)" = Darwin ]; then
    config="$HOME/Library/Application Support/deadletter/deadletter.toml"
  else
    config="$HOME/.config/deadletter/deadletter.toml"
  fi
  if [ ! -e "$config" ]; then
    "$target" config init "$config"
    echo "wrote the default config to $config"
  fi
fi
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "note: $prefix/bin is not on your PATH" ;;
esac
