#!/usr/bin/env bash
# Sourced by scripts/install-*.sh: `apt_packages LABEL PACKAGE...` installs the Debian packages of
# the list that are missing, saying first which those are (or that none is). apt's own output goes
# to a log, shown only when the install fails, so a set-up that works prints one line per list.
apt_packages() {
  local label=$1 pkg log
  shift
  local need=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
  done
  if [ "${#need[@]}" -eq 0 ]; then
    echo "${label}: all $# installed ($*)" >&2
    return 0
  fi
  echo "${label}: installing ${need[*]} ($(($# - ${#need[@]})) of $# already installed)" >&2
  log=$(mktemp -t cairn-apt.XXXXXX)
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "${label}: apt-get could not install ${need[*]}" >&2
    return 1
  fi
  rm -f "$log"
}
