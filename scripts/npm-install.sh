#!/usr/bin/env bash
# Installs the npm dependencies exactly from package-lock.json with `npm ci`. Where the registry
# (a mirror serving only this platform's packages) cannot describe other platforms' optional
# packages, npm 11 writes lockfiles that its own `npm ci` then refuses as "not in sync"; in that
# case the same lockfile is installed with `npm install`, which resolves from it as well.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! npm ci --no-audit --no-fund; then
  echo "npm ci refused the lockfile; installing from it with npm install instead" >&2
  npm install --no-audit --no-fund
fi
