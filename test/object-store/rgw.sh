#!/usr/bin/env bash
# A real S3 server for the tests: Ceph's RADOS Gateway from Debian on a one-node Ceph cluster
# (a monitor, one bluestore OSD on a loop device over a sparse file, RGW), all in one directory.
#
#   rgw.sh up DIR [SIZE_GIB]   start it; prints KEY=VALUE lines (S3_ENDPOINT, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY)
#   rgw.sh down DIR            stop what `up` started in DIR, detach its loop device, delete DIR
#   rgw.sh gateway-kill DIR    kill -9 the RGW process alone (the S3 endpoint goes away, the cluster stays)
#   rgw.sh gateway-start DIR   start RGW again on the same port and wait for it to answer
#
# `auth = none` keeps it to loopback-only test use; with it, `ms_mon_client_mode = crc` is needed
# or RGW waits 300 s for a secure session the monitor will never offer.
set -euo pipefail

cmd=${1:?usage: rgw.sh up|down DIR [SIZE_GIB]}
dir=${2:?usage: rgw.sh up|down DIR [SIZE_GIB]}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

down() {
  [ -d "$dir" ] || return 0
  for name in client.rgw osd.0 mon.a; do
    if [ -f "$dir/$name.pid" ]; then
      pid=$(cat "$dir/$name.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  if [ -f "$dir/loop" ]; then losetup -d "$(cat "$dir/loop")" 2>/dev/null || true; fi
  rm -rf "$dir"
}

up() {
  local size_gib=${3:-6}
  mkdir -p "$dir"/{mon,osd,run,log}
  dir=$(cd "$dir" && pwd)
  local mon_port rgw_port fsid osd_uuid loop
  mon_port=$(free_port)
  rgw_port=$(free_port)
  fsid=$(cat /proc/sys/kernel/random/uuid)
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  # The OSD's disk: a loop device over a sparse file.
  truncate -s "${size_gib}G" "$dir/osd.img"
  loop=$(losetup --find --show "$dir/osd.img")
  echo "$loop" >"$dir/loop"
  cat >"$dir/ceph.conf" <<CONF
[global]
fsid = $fsid
mon_host = v1:127.0.0.1:$mon_port
public_network = 127.0.0.0/8
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
ms_mon_client_mode = crc
ms_bind_msgr2 = false
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
osd_crush_chooseleaf_type = 0
run_dir = $dir/run
admin_socket = $dir/run/\$name.\$pid.asok
log_file = $dir/log/\$name.log
pid_file = $dir/\$name.pid
[mon]
mon_data = $dir/mon
mon_cluster_log_file = $dir/log/cluster.log
[osd]
osd_data = $dir/osd
# At start an OSD sends its device class and crush location to the monitor; Ceph 16 sends them
# before its monitor client holds the cluster's fsid now and then ('wrong fsid' from the monitor,
# the OSD exits at init). This script places osd.0 in the crush map itself instead.
osd_class_update_on_start = false
osd_crush_update_on_start = false
osd_objectstore = bluestore
bluestore_block_path = $loop
osd_memory_target = 939524096
bluestore_cache_autotune = false
bluestore_cache_size = 134217728
[client.rgw]
# tcp_nodelay: without it a small GET answer waits ~40 ms (Nagle against the client's delayed ACK).
rgw_frontends = beast endpoint=127.0.0.1:$rgw_port tcp_nodelay=1
rgw_data = $dir/rgw
rgw_dns_name = 127.0.0.1
rgw_thread_pool_size = 64
CONF
  local conf="$dir/ceph.conf"

  # The monitor.
  monmaptool --create --clobber --fsid "$fsid" --addv a "[v1:127.0.0.1:$mon_port]" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" -i a
  # The OSD: bluestore on the loop device.
  ceph -c "$conf" osd new "$osd_uuid" 0 >/dev/null
  ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >"$dir/log/osd-mkfs.log" 2>&1
  ceph -c "$conf" osd crush add osd.0 1.0 host=localhost root=default >/dev/null
  # ceph-osd returns once its daemon finished init, with init's status: an OSD that failed to
  # start is started again (three tries) rather than waited for.
  local try
  for try in 1 2 3; do
    if ceph-osd -c "$conf" -i 0 2>>"$dir/log/osd-start.log"; then break; fi
    if [ "$try" -eq 3 ]; then
      echo "the OSD did not start: $(tail -5 "$dir/log/osd-start.log")" >&2
      exit 1
    fi
    rm -f "$dir/osd.0.pid"
    sleep 1
  done
  # RGW creates its pools at start; it needs the OSD up and in.
  for _ in $(seq 1 600); do
    ceph -c "$conf" osd stat 2>/dev/null | grep -q '1 up' && break
    sleep 0.1
  done
  ceph -c "$conf" osd stat | grep -q '1 up' || { echo "the OSD did not come up: $(tail -5 "$dir/log/osd.0.log")" >&2; exit 1; }
  # RGW, and a user for the tests.
  mkdir -p "$dir/rgw"
  radosgw -c "$conf" -n client.rgw
  local access secret
  access=$(head -c 10 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F)
  secret=$(head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n')
  for _ in $(seq 1 600); do
    if curl -s -o /dev/null "http://127.0.0.1:$rgw_port/"; then break; fi
    sleep 0.1
  done
  # The answer must be our gateway's (an S3 bucket list), not another server's that took the port.
  curl -s "http://127.0.0.1:$rgw_port/" | grep -q ListAllMyBucketsResult || { echo "RGW did not answer on port $rgw_port: $(tail -5 "$dir/log/client.rgw.log")" >&2; exit 1; }
  radosgw-admin -c "$conf" -n client.rgw user create --uid cairn-test --display-name "Cairn tests" \
    --access-key "$access" --secret-key "$secret" >/dev/null
  echo "S3_ENDPOINT=http://127.0.0.1:$rgw_port"
  echo "S3_ACCESS_KEY_ID=$access"
  echo "S3_SECRET_ACCESS_KEY=$secret"
}

gateway_kill() {
  local pid
  pid=$(cat "$dir/client.rgw.pid")
  kill -9 "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  rm -f "$dir/client.rgw.pid"
}

gateway_start() {
  local port
  port=$(sed -n 's/^rgw_frontends = beast endpoint=127.0.0.1:\([0-9]*\).*$/\1/p' "$dir/ceph.conf")
  radosgw -c "$dir/ceph.conf" -n client.rgw
  for _ in $(seq 1 600); do
    if curl -s -o /dev/null "http://127.0.0.1:$port/"; then return 0; fi
    sleep 0.1
  done
  echo "RGW did not answer on port $port" >&2
  exit 1
}

case "$cmd" in
up) up "$@" ;;
down) down ;;
gateway-kill) gateway_kill ;;
gateway-start) gateway_start ;;
*) echo "usage: rgw.sh up|down|gateway-kill|gateway-start DIR [SIZE_GIB]" >&2; exit 2 ;;
esac
