#!/usr/bin/env bash
# The Debian packages `cairn server` and the CLI use, and nothing else (the tests' own are in
# scripts/install-test-deps.sh); it says which it installs. What each one costs when missing is
# what `cairn doctor` reports.
#   bubblewrap                      sandboxes (the default isolation)
#   runsc                           gVisor sandboxes (`isolation: gvisor`); on Debian 12 the 20240729
#                                   release from bookworm-backports (systrap), pinned so nothing else
#                                   comes from backports (scripts/lib/runsc-backports.sh)
#   btrfs-progs, util-linux         the storage pool (mkfs.btrfs, btrfs, mount, losetup, setpriv)
#   iproute2, nftables              transparent egress in each sandbox's network namespace
#   python3                         the idmapped-mount helper and the agent kit's shims
#   mmdebstrap, skopeo, umoci       agent images (`image: debian:<suite>`, OCI references)
#   debian-archive-keyring          at 2023.3+deb12u2 or later (the first of Debian 12's with
#                                   trixie's keys: mmdebstrap checks a suite's Release with the
#                                   host's /etc/apt/trusted.gpg.d)
#   ca-certificates, openssl        HTTPS, and the cluster's certificates (`cairn cluster init`)
set -euo pipefail
source "$(dirname "$0")/lib/apt-packages.sh"
source "$(dirname "$0")/lib/runsc-backports.sh"
runsc_from_backports
apt_packages "system packages for cairn" bubblewrap runsc btrfs-progs util-linux iproute2 nftables python3 \
  mmdebstrap skopeo umoci debian-archive-keyring ca-certificates openssl
keyring=$(dpkg-query -W -f='${Version}' debian-archive-keyring 2>/dev/null || true)
if [ -n "$keyring" ] && dpkg --compare-versions "$keyring" lt 2023.3+deb12u2; then
  echo "debian-archive-keyring ${keyring} is older than 2023.3+deb12u2: upgrading it" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debian-archive-keyring; } >/dev/null
fi
modprobe btrfs 2>/dev/null || true
modprobe loop 2>/dev/null || true
