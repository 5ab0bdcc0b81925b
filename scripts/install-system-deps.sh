#!/usr/bin/env bash
# Installs the Debian packages Cairn uses: bubblewrap and runsc (gVisor) for sandboxes, btrfs-progs (storage pool),
# util-linux (mount, losetup, setpriv), iproute2 and nftables (transparent egress), chromium for the console's browser tests,
# tmux and jq for the CLI's tests (a real terminal; the hosted docs' cleanup recipe), and postgresql (the control plane's
# second database: the tests start their own cluster from its binaries), and Ceph's monitor, OSD and RADOS Gateway
# (the S3 server the tests ship workspaces to: test/object-store/rgw.sh), mmdebstrap (Debian agent images), skopeo and
# umoci (OCI agent images) and docker-registry (the OCI image tests' local registry), and debian-archive-keyring at
# 2023.3+deb12u2 or later (the first of Debian 12's with trixie's keys: mmdebstrap checks a suite's Release with the
# host's /etc/apt/trusted.gpg.d, and test/images-trixie.test.ts builds a trixie image), and systemd for systemd-analyze
# (test/deploy/systemd.test.ts verifies the units in deploy/systemd; nothing here boots systemd).
set -euo pipefail
need=()
for pkg in bubblewrap runsc btrfs-progs util-linux iproute2 nftables python3 ca-certificates chromium fonts-dejavu-core tmux jq postgresql radosgw ceph-mon ceph-osd ceph-common curl mmdebstrap skopeo umoci docker-registry debian-archive-keyring systemd; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
keyring=$(dpkg-query -W -f='${Version}' debian-archive-keyring 2>/dev/null || true)
if [ -n "$keyring" ] && dpkg --compare-versions "$keyring" lt 2023.3+deb12u2; then need+=(debian-archive-keyring); fi
if [ "${#need[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
modprobe btrfs 2>/dev/null || true
modprobe loop 2>/dev/null || true
