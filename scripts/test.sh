#!/usr/bin/env bash
# README command two: set up this machine for Cairn and for its tests (scripts/install-test-deps.sh:
# what the quickstart installs, then what only the tests use) and run every test (formatter/linter check, build,
# unit and end-to-end tests against real sandboxes, a real btrfs pool and real SQLite, then the
# whole suite again on a real PostgreSQL that the test setup starts). Each step's time is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
timed() {
  local label=$1 began
  shift
  began=$(date +%s)
  "$@"
  echo "== ${label}: $(( $(date +%s) - began )) s ==" >&2
}
timed "system packages" bash scripts/install-test-deps.sh
if [ -n "${CI:-}" ] || [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  timed "npm packages" bash scripts/npm-install.sh
fi
timed "cairn on the PATH" bash scripts/link-cli.sh
timed "tests" npm test
