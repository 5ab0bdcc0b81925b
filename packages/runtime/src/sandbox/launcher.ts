/**
 * The first process of every sandbox (bwrap or gVisor, session or build, on demand or pooled): a
 * bash script run as root that cleans up what it inherited, joins the sandbox's cgroups and then
 * becomes the sandbox (setpriv + bwrap, or runsc).
 *
 * Inherited descriptors: a descriptor open without close-on-exec in whatever started the server
 * (`exec 300</some/dir` in the shell before `cairn server`, a supervisor's pipe) is open in the
 * server, and Node passes it to every child it spawns. bwrap keeps what it is given, so the agent
 * held it. The launcher closes every descriptor above the ones the driver passes on purpose
 * (bwrap's seccomp program on fd 3, the pool's command pipe on fd 4, bwrap's environment on fd 5)
 * before anything else runs.
 * dash cannot name a descriptor above 9, hence bash.
 */
export const LAUNCHER_SHELL = '/bin/bash'

/**
 * Where bwrap reads the sandbox's environment (`--args 5`: NUL-terminated `--setenv NAME VALUE`
 * options), so no value of it is ever an argument: a process's arguments are in
 * `/proc/PID/cmdline`, readable by every local user, for the launcher's and bwrap's whole life.
 * bwrap closes it once read.
 */
export const ENV_FD = 5

/**
 * Closes every descriptor above `$keep`. The listing's own descriptor is closed by the time the
 * loop runs, so only descriptors that still exist are closed (no error on stderr).
 */
const CLOSE_INHERITED =
  'for f in /proc/self/fd/*; do f=${f##*/}; if [ "$f" -gt "$keep" ] && [ -e "/proc/self/fd/$f" ]; then exec {f}<&-; fi; done'

/** Moves this process into the `$n` cgroup.procs files that follow, as root. */
const JOIN_CGROUPS =
  'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 111; shift; n=$((n-1)); done'

/** Arguments: the highest descriptor to keep, then the cgroup count and files, then the command. */
export const LAUNCHER = ['keep=$1; shift', CLOSE_INHERITED, JOIN_CGROUPS, 'exec "$@"'].join('\n')

/** Says it is ready (a byte on fd 4), then becomes the command that comes on fd 4 (see below). */
const AWAIT_COMMAND = [
  'printf r >&4 || exit 113',
  "mapfile -d '' -t a <&4 || exit 112",
  'exec 4<&-',
  '[ "${#a[@]}" -gt 0 ] || exit 0',
  'exec "${a[@]}"',
]

/**
 * A bwrap sandbox's command on fd 4 (see `bwrapCommandStream`): the stderr file (empty: keep the
 * stderr it has), the number of arguments, the arguments, each NUL-terminated; then fd 4, a socket
 * pair, becomes the sandbox's stdin AND stdout, so the server holds one descriptor per sandbox for
 * both (issue 33: its open-files limit bounded the warm sessions a server holds). EOF before the
 * command (the pool is closing): exit. `read` takes a socket a byte at a time, so nothing past the
 * command is read here.
 */
const AWAIT_BWRAP_COMMAND = [
  'printf r >&4 || exit 113',
  "IFS= read -r -d '' err <&4 || exit 0",
  "IFS= read -r -d '' n <&4 && [[ $n =~ ^[0-9]+$ ]] || exit 112",
  'a=()',
  `while [ "\${#a[@]}" -lt "$n" ]; do IFS= read -r -d '' w <&4 || exit 112; a+=("$w"); done`,
  '[ "$n" -gt 0 ] || exit 0',
  'if [ -n "$err" ]; then exec 2>>"$err" || exit 115; fi',
  'exec 0<&4 1>&4 4<&-',
  'exec "${a[@]}"',
]

/** What a pooled bwrap launcher reads on fd 4: `command` run with its stderr to `stderrFile` (if any). */
export function bwrapCommandStream(command: readonly string[], stderrFile: string | undefined): string {
  return [stderrFile ?? '', String(command.length), ...command].map((word) => `${word}\0`).join('')
}

/**
 * A pooled launcher (the bwrap driver's, on demand or spare): the same, then it says it is ready
 * (one byte on fd 4, a socket pair: its cgroups joined and its mount namespace its own, see
 * `BWRAP_LAUNCHER_PREFIX`) and waits for its command on fd 4 (`AWAIT_BWRAP_COMMAND`). fd 5
 * (`ENV_FD`) is kept for bwrap.
 */
export const POOLED_LAUNCHER = [`keep=${ENV_FD}`, CLOSE_INHERITED, JOIN_CGROUPS, ...AWAIT_BWRAP_COMMAND].join(
  '\n',
)

/**
 * A gVisor restore target's launcher (checkpoint/gvisor-restore-targets.ts): it joins the
 * cgroups, runs `runsc create` (fd 4 closed for it), whose sandbox boots with nothing run in it and
 * keeps this launcher's stdio as its own, says it is ready on fd 4 and waits there for `runsc
 * restore` (NUL-terminated arguments ended by EOF; none: exit), which it becomes. So the restored
 * agent's stdio is the launcher's pipes, which the server has held since the create.
 */
export const RESTORE_TARGET_LAUNCHER = [
  'keep=4',
  CLOSE_INHERITED,
  JOIN_CGROUPS,
  '"$@" 4<&- || exit 114',
  ...AWAIT_COMMAND,
].join('\n')

/**
 * `spawn` arguments of a launcher that keeps descriptors up to `keepFd`, joins `procsFiles` and
 * execs `command`. --norc: Debian's bash reads ~/.bashrc when its stdin is a socket (it takes
 * itself for an ssh command), and Node's stdio pipes are socketpairs: root's rc file must never run here.
 */
export function launcherArgs(
  keepFd: number,
  procsFiles: readonly string[],
  command: readonly string[],
): string[] {
  return [
    '--norc',
    '--noprofile',
    '-c',
    LAUNCHER,
    'cairn-launch',
    String(keepFd),
    String(procsFiles.length),
    ...procsFiles,
    ...command,
  ]
}

/**
 * What a bwrap sandbox's launcher runs under: a mount namespace of its own, private (nothing
 * propagates to or from the host's), where its sandbox's idmapped mounts and writable root are
 * made (launcher-mount-ns.ts). `unshare` execs the launcher in the same process.
 */
export const BWRAP_LAUNCHER_PREFIX = ['unshare', '--mount', '--propagation', 'private', '--']

/** The same for a pooled launcher (its command comes later, on fd 4). */
export function pooledLauncherArgs(procsFiles: readonly string[]): string[] {
  return [
    '--norc',
    '--noprofile',
    '-c',
    POOLED_LAUNCHER,
    'cairn-launch',
    String(procsFiles.length),
    ...procsFiles,
  ]
}

/** `spawn` arguments of a restore target's launcher that joins `procsFiles` and runs `create`. */
export function restoreTargetLauncherArgs(
  procsFiles: readonly string[],
  create: readonly string[],
): string[] {
  return [
    '--norc',
    '--noprofile',
    '-c',
    RESTORE_TARGET_LAUNCHER,
    'cairn-launch',
    String(procsFiles.length),
    ...procsFiles,
    ...create,
  ]
}
