#!/usr/bin/env bash
# README command two: set up this machine and run every test (formatter/linter check, build,
# unit and end-to-end tests against real sandboxes, a real btrfs pool and real SQLite, then the
# whole suite again on a real PostgreSQL that the test setup starts).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-system-deps.sh
if [ -n "${CI:-}" ] || [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  bash scripts/npm-install.sh
fi
bash scripts/link-cli.sh
npm test
