#!/usr/bin/env bash
# Builds the release artifact: a Debian package of the CLI and the server, installed with one
# command (`apt-get install ./dist/cairn_<version>_<arch>.deb`, which brings the system packages
# `cairn server` uses along). Usage: scripts/build-deb.sh [--no-build] [OUT_DIR] (default dist/);
# prints the package's path. Needs the checkout's node_modules (`npm ci`); it runs `npm run build`
# first unless told --no-build (the tests, which run on a built tree, while other tests use it).
#
# What it holds:
#   /usr/lib/cairn/                 the built packages and their production node_modules
#   /usr/bin/cairn                  the CLI (and `cairn server`, `cairn node`)
#   /lib/systemd/system/            cairn-server.service, cairn-node.service (deploy/systemd)
#   /etc/cairn/cairn.env.example    the units' environment, to copy to /etc/cairn/cairn.env
#   /usr/share/doc/cairn/           the docs (the units link to them)
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
if [ "${1:-}" = "--no-build" ]; then
  build=0
  shift
fi
out_dir=$(realpath -m "${1:-dist}")
version=$(node -p "require('./package.json').version")
arch=$(dpkg --print-architecture)
node_major=$(node -p 'process.versions.node.split(".")[0]')

stage=$(mktemp -d /tmp/cairn-deb.XXXXXX)
trap 'rm -rf "$stage"' EXIT
lib="$stage/usr/lib/cairn"
mkdir -p "$lib" "$stage/usr/bin" "$stage/lib/systemd/system" "$stage/etc/cairn" \
  "$stage/usr/share/doc/cairn" "$stage/DEBIAN" "$out_dir"

if [ "$build" = 1 ]; then npm run build --silent >&2; fi
[ -f packages/cli/dist/cairn.cjs ] || { echo "build-deb: the checkout is not built (npm run build)" >&2; exit 1; }

# The workspace as npm sees it (so that its links under node_modules/@cairn resolve), with only
# what running needs: each package's manifest and build output, then the production dependencies.
cp package.json package-lock.json "$lib/"
for pkg in packages/*/; do
  pkg=${pkg%/}
  mkdir -p "$lib/$pkg"
  cp "$pkg/package.json" "$lib/$pkg/"
  # What npm would publish of it: its manifest's "files".
  for part in $(node -p "(require('./$pkg/package.json').files ?? []).join('\\n')"); do
    cp -a "$pkg/$part" "$lib/$pkg/"
  done
done
find "$lib/packages" \( -name '*.test.js' -o -name '*.test.d.ts' -o -name '*.tsbuildinfo' \) -delete
# The production dependencies only (`npm ls --omit=dev`), each copied once with what it nests.
mkdir -p "$lib/node_modules"
cp -a node_modules/@cairn "$lib/node_modules/"
production=$(npm ls --omit=dev --all --parseable 2>/dev/null || true)
for dir in $(printf '%s\n' "$production" | sed -n "s#^$(pwd)/##p" | grep '^node_modules/' | sort -u); do
  if [ ! -e "$lib/$dir" ]; then
    mkdir -p "$lib/$(dirname "$dir")"
    cp -a "$dir" "$lib/$dir"
  fi
done
rm -rf "$lib/node_modules/.cache"
# Nothing running reads types, source maps, docs or a native module's sources and objects; fewer
# files install and remove faster (dpkg's time goes by files).
find "$lib/node_modules" -type f \( -name '*.ts' -o -name '*.mts' -o -name '*.cts' -o -name '*.map' \
  -o -iname 'README*' -o -iname 'CHANGELOG*' -o -iname 'HISTORY*' \) -delete
sqlite_module="$lib/node_modules/better-sqlite3"
rm -rf "$sqlite_module/deps" "$sqlite_module/src" "$sqlite_module/build/Release/obj" \
  "$sqlite_module/build/Release/obj.target" "$sqlite_module/build/Release/test_extension.node" \
  "$sqlite_module/build/Release/sqlite3.a" "$sqlite_module/build/deps"

cat >"$stage/usr/bin/cairn" <<'SH'
#!/bin/sh
exec node /usr/lib/cairn/packages/cli/bin/cairn.js "$@"
SH
chmod 0755 "$stage/usr/bin/cairn"

for unit in deploy/systemd/*.service; do
  sed -e 's#/usr/local/bin/cairn#/usr/bin/cairn#g' -e 's#file:///opt/cairn/docs/#file:///usr/share/doc/cairn/#g' \
    "$unit" >"$stage/lib/systemd/system/$(basename "$unit")"
done
cp deploy/systemd/cairn.env.example "$stage/etc/cairn/cairn.env.example"
cp -r docs/. "$stage/usr/share/doc/cairn/"
rm -rf "$stage/usr/share/doc/cairn/screenshots"
cp README.md "$stage/usr/share/doc/cairn/"

# Depends: what scripts/install-system-deps.sh installs, and a Node.js as new as the one that built
# the native modules (better-sqlite3's ABI follows the major version).
depends="nodejs (>= ${node_major}), nodejs (<< $((node_major + 1))), bubblewrap, btrfs-progs, util-linux, iproute2, nftables, python3, ca-certificates, openssl"
recommends="runsc, mmdebstrap, skopeo, umoci, debian-archive-keyring"
installed_kib=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: cairn
Version: ${version}
Architecture: ${arch}
Maintainer: Cairn developers <cairn@localhost>
Installed-Size: ${installed_kib}
Depends: ${depends}
Recommends: ${recommends}
Section: admin
Priority: optional
Homepage: https://github.com/cairn-dev/cairn
Description: persistent, isolated sessions for AI agents, self-hosted
 Cairn deploys AI agents and runs every conversation with one as a persistent,
 isolated session: its own sandbox, a /workspace that survives turns, crashes
 and restarts, a transcript, snapshots to restore and fork, secrets the agent
 cannot leak, and egress denied unless allowed.
CONTROL
echo "/etc/cairn/cairn.env.example" >"$stage/DEBIAN/conffiles"

deb="$out_dir/cairn_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zgzip -z3 --build "$stage" "$deb" >&2
echo "$deb"
