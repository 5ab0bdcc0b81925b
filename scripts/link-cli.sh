#!/usr/bin/env bash
# Puts `cairn` on the PATH: a symlink from /usr/local/bin/cairn (or $CAIRN_BIN_DIR/cairn) to this
# checkout's packages/cli/bin/cairn.js, which runs the built CLI (packages/cli/dist). Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
bin_dir="${CAIRN_BIN_DIR:-/usr/local/bin}"
mkdir -p "$bin_dir"
ln -sfn "$(pwd)/packages/cli/bin/cairn.js" "$bin_dir/cairn"
case ":$PATH:" in
  *":$bin_dir:"*) ;;
  *) echo "note: $bin_dir is not on PATH; add it to use \`cairn\`" >&2 ;;
esac
