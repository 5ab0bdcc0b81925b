#!/usr/bin/env bash
# README command one: set up this machine with what Cairn uses and nothing else (the Debian
# packages of scripts/install-system-deps.sh, which says which it installs; the tests' are the
# test command's), start Cairn on the embedded defaults (SQLite, a loop-backed btrfs pool under
# the data dir, bubblewrap sandboxes), deploy the notes example and have a session answer twice:
# a fact in turn 1, recalled from the workspace in turn 2.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

if [ "$(id -u)" -ne 0 ]; then
  echo "Cairn's runtime mounts a btrfs pool and creates cgroups: run this as root (sudo)." >&2
  exit 1
fi

echo "==> system packages" >&2
bash scripts/install-system-deps.sh
echo "==> npm ci and build" >&2
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  bash scripts/npm-install.sh >&2
fi
npm run build --silent >&2
echo "==> cairn on the PATH (/usr/local/bin/cairn)" >&2
bash scripts/link-cli.sh

export CAIRN_DATA_DIR="${CAIRN_DATA_DIR:-$HOME/.cairn/data}"
PORT="${CAIRN_PORT:-7070}"
export CAIRN_API_URL="http://127.0.0.1:${PORT}"
mkdir -p "$CAIRN_DATA_DIR"
CAIRN="node $ROOT/packages/cli/bin/cairn.js"

healthy() {
  node -e "fetch('$CAIRN_API_URL/healthz').then(r => process.exit(r.ok ? 0 : 1), () => process.exit(1))"
}

if healthy; then
  echo "==> a Cairn server is already running at $CAIRN_API_URL" >&2
else
  echo "==> starting cairn server (log: $CAIRN_DATA_DIR/server.log)" >&2
  nohup $CAIRN server --data-dir "$CAIRN_DATA_DIR" --port "$PORT" >"$CAIRN_DATA_DIR/server.log" 2>&1 &
  echo $! >"$CAIRN_DATA_DIR/server.pid"
  for _ in $(seq 1 100); do
    healthy && break
    sleep 0.2
  done
  healthy || { echo "server did not start; see $CAIRN_DATA_DIR/server.log" >&2; tail -20 "$CAIRN_DATA_DIR/server.log" >&2; exit 1; }
fi
CAIRN_API_KEY="$(cat "$CAIRN_DATA_DIR/admin.key")"
export CAIRN_API_KEY

echo "==> deploying examples/notes" >&2
$CAIRN deploy examples/notes --yes

echo "==> a session: a fact in turn 1, a question in turn 2" >&2
printf 'My cat is called Miso\nWhat is my cat called?\n' | $CAIRN run notes

cat >&2 <<INFO

Cairn is running at $CAIRN_API_URL (pid $(cat "$CAIRN_DATA_DIR/server.pid" 2>/dev/null || echo '?'), data in $CAIRN_DATA_DIR).
Try:   cairn sessions list
       cairn run notes
Check: cairn doctor   (what this machine lacks for Cairn, what that costs, how to fix it)
Stop:  kill \$(cat $CAIRN_DATA_DIR/server.pid)
INFO
