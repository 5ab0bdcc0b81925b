import { expect } from 'vitest'
import type { IsolationName } from '../../packages/runtime/src/sandbox/driver.js'
import type { Api } from './server.js'

/**
 * The escape probe: one Python program that tries to break out of its sandbox and prints what the
 * sandbox answered. test/security/escape.test.ts runs it as a stdio agent through the API (one
 * attempt per message); test/conformance/sandbox.test.ts runs its fixed checks once per driver.
 *
 * Messages: a check name (`mount`, `shadow` …), `all` (every fixed check, one `name=result` line
 * each), or a command with arguments: `ptrace PID`, `kill PID`, `procs`, `write NAME TEXT`,
 * `search MARKER HOSTPATH…`, `setuid`, `forkbomb`, `membomb`, `fill`, `blob NAME MIB`, `cat NAME`,
 * `rm NAME`, `destroy-ids LO HI` (btrfs SNAP_DESTROY_V2 by subvolume id), `subvol-escape MIB`,
 * `search-fds MARKER`, `stderr TEXT`, `stderr-flood MIB` (a child left writing MIB MiB to
 * stderr after the turn).
 */
export const ESCAPE_PROBE = String.raw`import ctypes, errno, json, os, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]

def errno_of(fn):
    ctypes.set_errno(0)
    return "ok" if fn() == 0 else os.strerror(ctypes.get_errno())

def try_open(path, mode, data=None):
    try:
        with open(path, mode) as f:
            if data is not None:
                f.write(data)
        return "opened"
    except OSError as e:
        return e.strerror

def status_field(name, pid="self"):
    found = [l for l in open("/proc/%s/status" % pid) if l.startswith(name + ":")]
    return found[0].split()[1:] if found else ["absent"]

def in_child(fn):
    # Checks that would change this process (a new namespace, new ids) run in a throwaway child.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = fn()
        except BaseException as e:
            out = "raised " + type(e).__name__
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    out = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return out

def clone_userns():
    ctypes.set_errno(0)
    pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD), fork-like
    if pid == 0:
        os._exit(0)
    if pid < 0:
        return os.strerror(ctypes.get_errno())
    os.waitpid(pid, 0)
    return "ok"

def clone3_userns():
    args = (ctypes.c_uint64 * 11)()  # struct clone_args
    args[0] = 0x10000000  # flags: CLONE_NEWUSER
    args[4] = 17  # exit_signal: SIGCHLD
    ctypes.set_errno(0)
    pid = libc.syscall(435, ctypes.byref(args), ctypes.sizeof(args))
    if pid == 0:
        os._exit(0)
    if pid < 0:
        return os.strerror(ctypes.get_errno())
    os.waitpid(pid, 0)
    return "ok"

# btrfs ioctls (type byte 0x94): a sandbox may issue none of them.
BTRFS_IOC_SUBVOL_CREATE = 0x5000940E  # _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
BTRFS_IOC_SNAP_DESTROY_V2 = 0x5000943F  # _IOW(0x94, 63, struct btrfs_ioctl_vol_args_v2)
FS_IOC_GETFSLABEL = 0x81009431  # _IOR(0x94, 49, char[256]): read-only, any user
BTRFS_SUBVOL_SPEC_BY_ID = 1 << 4
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]

def ioctl(path, request, buf):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ctypes.set_errno(0)
        return "ok" if libc.ioctl(fd, request, buf) >= 0 else os.strerror(ctypes.get_errno())
    finally:
        os.close(fd)

def subvol_create(parent, name, high_bits=0):
    args = ctypes.create_string_buffer(4096)  # struct btrfs_ioctl_vol_args: s64 fd, char name[4088]
    args[8:8 + len(name)] = name.encode()
    return ioctl(parent, (high_bits << 32) | BTRFS_IOC_SUBVOL_CREATE, args)

def subvol_create_check(high_bits=0):
    name = ".probe-subvol"
    out = subvol_create("/workspace", name, high_bits)
    if os.path.isdir("/workspace/" + name):
        os.rmdir("/workspace/" + name)  # rmdir removes an empty subvolume
    return out

def destroy_by_id(subvolid):
    args = ctypes.create_string_buffer(4096)  # struct btrfs_ioctl_vol_args_v2
    ctypes.c_uint64.from_buffer(args, 16).value = BTRFS_SUBVOL_SPEC_BY_ID  # flags
    ctypes.c_uint64.from_buffer(args, 56).value = subvolid  # the union after 4 reserved u64s
    return ioctl("/workspace", BTRFS_IOC_SNAP_DESTROY_V2, args)

def destroy_range(lo, hi):
    # The reported attack: destroy every subvolume id in turn; the answers must not tell which exist.
    seen = {}
    for subvolid in range(lo, hi + 1):
        out = destroy_by_id(subvolid)
        seen[out] = seen.get(out, 0) + 1
    return json.dumps(seen, sort_keys=True)

def subvol_escape(mib):
    # A nested subvolume has no quota of its own: writes under it would escape the workspace's.
    created = subvol_create("/workspace", "sub")
    os.makedirs("/workspace/sub", exist_ok=True)
    chunk = os.urandom(1 << 20)
    written = 0
    try:
        with open("/workspace/sub/big.bin", "wb") as f:
            while written < (mib << 20):
                f.write(chunk)
                f.flush()
                written += len(chunk)
            os.fsync(f.fileno())
        wrote = "wrote %d MiB" % (written >> 20)
    except OSError as e:
        wrote = "%s after %d MiB" % (errno.errorcode.get(e.errno, str(e.errno)), written >> 20)
    return "create=%s %s" % (created, wrote)

def io_uring():
    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    answers = []
    for name, call in (
        ("setup", lambda: libc.syscall(425, 1, params)),
        ("enter", lambda: libc.syscall(426, -1, 0, 0, 0, None, 0)),
        ("register", lambda: libc.syscall(427, -1, 0, None, 0)),
    ):
        ctypes.set_errno(0)
        fd = call()
        if fd >= 0:
            if name == "setup":
                os.close(fd)
            answers.append(name + "=ok")
        else:
            answers.append(name + "=" + os.strerror(ctypes.get_errno()))
    return " ".join(answers)

def open_fds():
    # Descriptors beyond stdio: anything here came from whoever started the sandbox.
    found = []
    for name in os.listdir("/proc/self/fd"):
        if int(name) <= 2:
            continue
        try:
            found.append("%s:%s" % (name, os.readlink("/proc/self/fd/" + name)))
        except OSError:
            pass  # the directory listing's own descriptor, closed by now
    return " ".join(sorted(found)) or "none"

def search_fds(marker):
    # Looks for the marker through every descriptor the sandbox holds (an inherited directory, say).
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2:
            continue
        try:
            if marker in os.listdir(fd):
                found.append(name)
        except OSError:
            pass
    return " ".join(found) or "not found"

def run(argv):
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return "exit %d: %s" % (p.returncode, p.stdout.decode().strip().replace("\n", " | "))

CHECKS = {
    # Host-managing syscalls: refused by seccomp (bwrap) or by gVisor's kernel.
    "mount": lambda: in_child(lambda: errno_of(lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))),
    "unshare-net": lambda: in_child(lambda: errno_of(lambda: libc.unshare(0x40000000))),
    "unshare-user": lambda: in_child(lambda: errno_of(lambda: libc.unshare(0x10000000))),
    "clone-userns": lambda: in_child(clone_userns),
    "clone3-userns": lambda: in_child(clone3_userns),
    "keyctl": lambda: errno_of(lambda: libc.syscall(250, 0, 0, 0, 0, 0)),
    "bpf": lambda: errno_of(lambda: libc.syscall(321, 0, 0, 0)),
    "ptrace": lambda: errno_of(lambda: libc.ptrace(16, 1, None, None)),  # PTRACE_ATTACH to pid 1
    "kexec": lambda: errno_of(lambda: libc.syscall(246, 0, 0, 0, 0)),
    "init-module": lambda: errno_of(lambda: libc.syscall(175, 0, 0, b"")),
    "io-uring": io_uring,
    # Calls outside the seccomp allow list: one the kernel has long had, one it added in 6.8.
    "unlisted-sysfs": lambda: errno_of(lambda: libc.syscall(139, 3)),
    "unlisted-listmount": lambda: errno_of(lambda: libc.syscall(458, 0, 0, 0, 0)),
    # btrfs ioctls on the workspace (a subvolume of the host's pool): none is the agent's.
    "btrfs-subvol-create": subvol_create_check,
    # The request is compared as the kernel reads it (32 bits): high bits change nothing.
    "btrfs-subvol-create-high-bits": lambda: subvol_create_check(0xFFFFFFFF),
    "btrfs-fs-label": lambda: ioctl("/workspace", FS_IOC_GETFSLABEL, ctypes.create_string_buffer(256)),
    "fds": open_fds,
    # Host files: absent, or read-only.
    "shadow": lambda: try_open("/etc/shadow", "r"),
    "write-usr": lambda: try_open("/usr/cairn-escape", "w"),
    "write-etc": lambda: try_open("/etc/cairn-escape", "w"),
    "write-root": lambda: try_open("/cairn-escape", "w"),
    "write-run": lambda: try_open("/run/cairn/cairn-escape", "w"),
    "write-opt": lambda: try_open("/opt/cairn/cairn-escape", "w"),
    "docker": lambda: str(any(os.path.exists(p) for p in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"))),
    "root-home": lambda: str(os.path.exists("/root")),
    # Kernel knobs: /proc/sys and /sys are not the agent's to write.
    "proc-sys": lambda: try_open("/proc/sys/kernel/hostname", "w", "escaped"),
    "proc-sys-vm": lambda: try_open("/proc/sys/vm/drop_caches", "w", "3"),
    "sysrq": lambda: try_open("/proc/sysrq-trigger", "w", "h"),
    "sys-uevent": lambda: try_open("/sys/kernel/uevent_helper", "w", "/workspace/x"),
    "sys-cgroup": lambda: try_open("/sys/fs/cgroup/cgroup.procs", "w", "1"),
    "oom-adj": lambda: try_open("/proc/self/oom_score_adj", "w", "-1000"),
    # Privileges: none, and none to gain.
    "env": lambda: ",".join(sorted(k for k in os.environ if not k.startswith(("CAIRN_", "PYTHON", "NODE_", "BASH_")))),
    "caps": lambda: status_field("CapEff")[0],
    "nonewprivs": lambda: str(libc.prctl(39, 0, 0, 0, 0)),  # PR_GET_NO_NEW_PRIVS
    "setuid-root": lambda: in_child(lambda: errno_of(lambda: libc.setuid(0))),
    "su": lambda: run(["su", "root", "-c", "id -u"]),
    "mount-bin": lambda: run(["mount", "-t", "tmpfs", "none", "/tmp"]),
    "umount-bin": lambda: run(["umount", "/workspace"]),
}

def setuid_binary():
    # A setuid-root binary that waits on stdin: its effective uid while it runs shows whether the
    # bit granted anything (NoNewPrivs says it must not).
    p = subprocess.Popen(["su", "root", "-c", "id -u"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                if open("/proc/%d/comm" % p.pid).read().strip() == "su" and status_field("State", p.pid)[0] == "S":
                    return "euid=%s caps=%s" % (status_field("Uid", p.pid)[1], status_field("CapEff", p.pid)[0])
            except (OSError, IndexError):
                pass
            time.sleep(0.01)
        return "su did not wait (exit %s)" % p.poll()
    finally:
        p.kill()
        p.wait()

def procs():
    mine = os.environ.get("CAIRN_SESSION_ID")
    seen = []
    for pid in sorted(int(d) for d in os.listdir("/proc") if d.isdigit()):
        try:
            cmd = open("/proc/%d/cmdline" % pid, "rb").read().split(b"\0")[0].decode()
        except OSError:
            cmd = "?"
        try:
            env = open("/proc/%d/environ" % pid, "rb").read().split(b"\0")
            session = next((v[17:].decode() for v in env if v.startswith(b"CAIRN_SESSION_ID=")), "-")
        except OSError as e:
            session = e.strerror
        seen.append({"pid": pid, "cmd": os.path.basename(cmd), "session": "mine" if session == mine else session})
    return json.dumps(seen)

SKIP_WALK = ("/usr", "/proc", "/sys", "/dev", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

def search(marker, host_paths):
    found = []
    for base in host_paths:
        if os.path.exists(os.path.join(base, marker)) or os.path.exists(base):
            found.append(base)
    # Through other processes' views of the filesystem.
    for pid in (d for d in os.listdir("/proc") if d.isdigit()):
        for link in ("root", "cwd"):
            for base in ["/workspace", ""] + list(host_paths):
                p = "/proc/%s/%s%s/%s" % (pid, link, base, marker)
                try:
                    if os.path.exists(p):
                        found.append(p)
                except OSError:
                    pass
    # Anywhere the sandbox can list.
    for root, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in SKIP_WALK]
        if marker in files:
            found.append(os.path.join(root, marker))
    return " ".join(found) or "not found"

def forkbomb():
    # The classic one: every shell starts two more, for ever.
    print("forking", flush=True)
    os.execv("/bin/bash", ["bash", "-c", ":(){ :|:& };:; sleep 60"])

def membomb():
    print("allocating", flush=True)
    blocks = []
    while True:
        blocks.append(b"\x01" * (8 << 20))

def blob(name, mib):
    with open(name, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
        os.fsync(f.fileno())
    return "wrote %d MiB" % (os.path.getsize(name) >> 20)

def fill():
    chunk = os.urandom(1 << 20)
    written = 0
    try:
        with open("/workspace/fill.bin", "wb") as f:
            while written < (512 << 20):
                f.write(chunk)
                f.flush()
                written += len(chunk)
            os.fsync(f.fileno())
        return "wrote %d MiB with no error" % (written >> 20)
    except OSError as e:
        return "%s after %d MiB" % (errno.errorcode.get(e.errno, str(e.errno)), written >> 20)

def stderr_flood(mib):
    # A process left behind after the turn, writing mib MiB to the agent's stderr.
    if os.fork() == 0:
        chunk = b"e" * (1 << 20)
        try:
            for _ in range(mib):
                os.write(2, chunk)
        finally:
            os._exit(0)
    return "flooding"

def answer(line):
    cmd, _, arg = line.partition(" ")
    if cmd == "all":
        return "\n".join(name + "=" + check() for name, check in CHECKS.items())
    if cmd in CHECKS:
        return CHECKS[cmd]()
    if cmd == "ptrace":
        return errno_of(lambda: libc.ptrace(16, int(arg), None, None))
    if cmd == "kill":
        return errno_of(lambda: libc.kill(int(arg), 0))
    if cmd == "procs":
        return procs()
    if cmd == "write":
        name, _, text = arg.partition(" ")
        open(name, "w").write(text)
        return "wrote " + name
    if cmd == "blob":
        name, mib = arg.split()
        return blob(name, int(mib))
    if cmd == "cat":
        return open(arg).read()
    if cmd == "stderr":
        print(arg, file=sys.stderr, flush=True)
        return "wrote stderr"
    if cmd == "stderr-flood":
        return stderr_flood(int(arg))
    if cmd == "rm":
        os.remove(arg)
        return "removed " + arg
    if cmd == "search":
        marker, *host_paths = arg.split()
        return search(marker, host_paths)
    if cmd == "destroy-ids":
        lo, hi = arg.split()
        return destroy_range(int(lo), int(hi))
    if cmd == "subvol-escape":
        return subvol_escape(int(arg))
    if cmd == "search-fds":
        return search_fds(arg)
    if cmd == "setuid":
        return setuid_binary()
    if cmd == "forkbomb":
        forkbomb()
    if cmd == "membomb":
        membomb()
    if cmd == "fill":
        return fill()
    return "unknown " + cmd

while True:
    try:
        line = input()
    except EOFError:
        break
    print(answer(line), flush=True)
`

const EPERM = 'Operation not permitted'
const EACCES = 'Permission denied'
const ENOENT = 'No such file or directory'
const EROFS = 'Read-only file system'
const ENOSYS = 'Function not implemented'

/** What every driver answers alike. */
const CONTAINED_EVERYWHERE = {
  mount: EPERM,
  'unshare-net': EPERM,
  'unshare-user': EPERM,
  keyctl: EPERM,
  bpf: EPERM,
  ptrace: EPERM,
  kexec: EPERM,
  'init-module': EPERM,
  'io-uring': `setup=${EPERM} enter=${EPERM} register=${EPERM}`,
  'btrfs-subvol-create': EPERM,
  'btrfs-subvol-create-high-bits': EPERM,
  'btrfs-fs-label': EPERM,
  fds: 'none',
  shadow: ENOENT,
  docker: 'False',
  'root-home': 'False',
  'proc-sys': EACCES,
  'proc-sys-vm': EACCES,
  env: 'HOME,LANG,PATH,PWD,TMPDIR,USER',
  caps: '0000000000000000',
  nonewprivs: '1',
  su: expect.stringMatching(/^exit 1: su: /),
  'mount-bin': expect.stringMatching(/^exit 32: mount: \/tmp: must be superuser to use mount\./),
  'umount-bin': expect.stringMatching(/^exit 32: umount: \/workspace: umount failed: /),
}

/**
 * The answer of each fixed check, per driver: every one a refusal. The drivers differ only in which
 * refusal: bwrap's seccomp filter and read-only binds, or gVisor's own kernel.
 */
export const CONTAINED: Record<IsolationName, Record<string, unknown>> = {
  bwrap: {
    ...CONTAINED_EVERYWHERE,
    // The allow list answers as a kernel without the call would.
    'unlisted-sysfs': ENOSYS,
    'unlisted-listmount': ENOSYS,
    // --disable-userns leaves the sandbox's user namespace no room for another one.
    'clone-userns': 'No space left on device',
    'clone3-userns': 'No space left on device',
    'write-usr': EROFS,
    'write-etc': EROFS,
    'write-root': EROFS,
    'write-run': EROFS,
    'write-opt': EROFS,
    // No /sys at all, and bwrap's /proc has no sysrq trigger for the sandbox.
    sysrq: ENOENT,
    'sys-uevent': ENOENT,
    'sys-cgroup': ENOENT,
    'oom-adj': EACCES,
    // Host root is not mapped in the sandbox's user namespace.
    'setuid-root': 'Invalid argument',
  },
  gvisor: {
    ...CONTAINED_EVERYWHERE,
    // runsc answers every call outside the allow list EPERM (it ignores errnoRet).
    'unlisted-sysfs': EPERM,
    'unlisted-listmount': EPERM,
    'clone-userns': EPERM,
    // This gVisor has no clone3 (a release that adds it must refuse CLONE_NEWUSER there too).
    'clone3-userns': 'Function not implemented',
    // gVisor checks ownership before the read-only mount: refused either way.
    'write-usr': EACCES,
    'write-etc': EACCES,
    'write-root': EACCES,
    'write-run': EACCES,
    'write-opt': EACCES,
    // gVisor's own read-only /sys and /proc.
    sysrq: EACCES,
    'sys-uevent': EACCES,
    'sys-cgroup': EACCES,
    // gVisor keeps the score in its own kernel without a privilege check; the host processes'
    // scores do not change (test/security/escape.test.ts checks them).
    'oom-adj': 'opened',
    'setuid-root': EPERM,
  },
}

/** The fixed checks `all` runs, by name. */
export type ProbeResults = Record<string, string>

/** Parses the `name=result` lines of `all`. */
export function parseProbeResults(out: string): ProbeResults {
  return Object.fromEntries(
    out
      .trim()
      .split('\n')
      .map((line) => {
        const at = line.indexOf('=')
        return [line.slice(0, at), line.slice(at + 1)]
      }),
  )
}

/**
 * A project whose stdio agent is the escape probe, deployed as `name` under `isolation`; with
 * `small`, the tight limits the bombs are tried under (64 MiB, 32 pids).
 */
export function probeProjectFiles(
  name: string,
  isolation: IsolationName,
  small = false,
): Record<string, string> {
  const limits = small ? 'limits:\n  memoryMiB: 64\n  pids: 32\n' : ''
  return {
    'cairn.yaml': `name: ${name}\ncommand: python3 probe.py\nisolation: ${isolation}\n${limits}`,
    'probe.py': ESCAPE_PROBE,
  }
}

/** Sends one message to a probe session; the turn must complete (the attempt failed and the probe said how). */
export async function askProbe(api: Api, sessionId: string, message: string): Promise<string> {
  const run = await api.send(sessionId, message)
  expect(run.terminal?.type, JSON.stringify(run.terminal)).toBe('run.completed')
  return run.text.trim()
}
