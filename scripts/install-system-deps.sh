#!/usr/bin/env bash
# Installs the Debian packages Cairn uses: bubblewrap and runsc (gVisor) for sandboxes, btrfs-progs (storage pool),
# util-linux (mount, losetup, setpriv), iproute2 and nftables (transparent egress), chromium for the console's browser tests,
# tmux and jq for the CLI's tests (a real terminal; the hosted docs' cleanup recipe), and postgresql (the control plane's
# second database: the tests start their own cluster from its binaries), and Ceph's monitor, OSD and RADOS Gateway
# (the S3 server the tests ship workspaces to: test/object-store/rgw.sh).
set -euo pipefail
need=()
for pkg in bubblewrap runsc btrfs-progs util-linux iproute2 nftables python3 ca-certificates chromium fonts-dejavu-core tmux jq postgresql radosgw ceph-mon ceph-osd ceph-common curl; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
modprobe btrfs 2>/dev/null || true
modprobe loop 2>/dev/null || true
