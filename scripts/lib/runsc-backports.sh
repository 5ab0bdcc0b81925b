#!/usr/bin/env bash
# Sourced by scripts/install-system-deps.sh: `runsc_from_backports` puts gVisor's runsc 20240729
# (the systrap platform; Debian 12's own is 20221219, ptrace only) from bookworm-backports on a
# Debian 12 host. The backports suite is added with a pin that keeps every other package out of it
# (priority -1) and takes runsc from it (990): runsc is one static binary with no dependencies, so
# nothing else comes along. On another release it does nothing (that release's own runsc is used).
RUNSC_BACKPORTS_MIN=0.0~20240729
runsc_from_backports() {
  local codename sources prefs installed log
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
  [ "$codename" = bookworm ] || return 0
  sources=/etc/apt/sources.list.d/cairn-bookworm-backports.sources
  prefs=/etc/apt/preferences.d/cairn-bookworm-backports
  if [ ! -f "$sources" ]; then
    printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm-backports' \
      'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' >"$sources"
  fi
  printf '%s\n' '# Written by cairn scripts/install-system-deps.sh: runsc only from bookworm-backports.' \
    'Package: *' 'Pin: release n=bookworm-backports' 'Pin-Priority: -1' '' \
    'Package: runsc' 'Pin: release n=bookworm-backports' 'Pin-Priority: 990' >"$prefs"
  installed=$(dpkg-query -W -f='${Version}' runsc 2>/dev/null || true)
  if [ -n "$installed" ] && dpkg --compare-versions "$installed" ge "$RUNSC_BACKPORTS_MIN"; then
    echo "runsc ${installed} (bookworm-backports): installed" >&2
    return 0
  fi
  echo "runsc ${installed:-(none)}: installing runsc from bookworm-backports" >&2
  log=$(mktemp -t cairn-apt.XXXXXX)
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runsc; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "apt-get could not install runsc from bookworm-backports" >&2
    return 1
  fi
  rm -f "$log"
}
