#!/usr/bin/env bash
# What the test suite uses on top of what Cairn itself does (scripts/install-system-deps.sh, run
# first): it says which it installs.
#   chromium, fonts-dejavu-core     the console's browser tests
#   tmux, jq                        the CLI's tests (a real terminal; the hosted docs' cleanup recipe)
#   postgresql                      the second database (the tests start their own cluster from its binaries)
#   radosgw, ceph-mon, ceph-osd,    the S3 server the tests ship workspaces to (test/object-store/rgw.sh)
#   ceph-common, curl
#   docker-registry                 the OCI image tests' local registry
#   systemd                         systemd-analyze (test/deploy/systemd.test.ts verifies deploy/systemd;
#                                   nothing here boots systemd)
set -euo pipefail
here=$(dirname "$0")
bash "$here/install-system-deps.sh"
source "$here/lib/apt-packages.sh"
apt_packages "system packages for the tests" chromium fonts-dejavu-core tmux jq postgresql radosgw ceph-mon \
  ceph-osd ceph-common curl docker-registry systemd
