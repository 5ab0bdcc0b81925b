# Cairn stdio shim for bash scripts (loaded through BASH_ENV): `read` from the agent's original
# stdin first marks the end of the turn, so a plain `while read -r line` loop works unchanged.
if [ -n "$CAIRN_STDIO_MARK" ] && [ "$CAIRN_PROTOCOL" = stdio ] && [ -z "$__CAIRN_SHIM" ]; then
  __CAIRN_SHIM=1
  __cairn_lines=0
  exec 9<&0
  read() {
    if [[ /proc/self/fd/0 -ef /proc/self/fd/9 ]]; then
      printf '\036%s:%d\037' "$CAIRN_STDIO_MARK" "$__cairn_lines"
      builtin read "$@"
      local __cairn_rc=$?
      [ "$__cairn_rc" -eq 0 ] && __cairn_lines=$((__cairn_lines + 1))
      return "$__cairn_rc"
    fi
    builtin read "$@"
  }
fi
