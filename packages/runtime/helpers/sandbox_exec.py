"""Cairn's sandbox exec: runs one command inside a session's running sandbox.

Run as root on the host by the launcher (which closed what it inherited and joined the sandbox's
cgroups, so the command counts against the sandbox's limits). It enters every namespace of the
sandbox's process <pid>, forks (a pid namespace holds only the children of who entered it), and
the child starts a session of its own, becomes the sandbox's user, sets no_new_privs, loads the
sandbox's seccomp program (the same one bwrap loads) and executes the command in <cwd>.

fd 3: the command's environment, NUL-separated NAME=VALUE, never on a command line (argv is
readable by every local user). fd 4: control lines from the runtime, `SIG <number>`: the signal
goes to the command's process group. The end of fd 4 (the runtime gone or done) kills the group.
fd 5: one status line to the runtime once the command runs (`OK`), or why it could not start
(`ERR sandbox <reason>`: the sandbox is gone; `ERR exec <reason>`: the program could not be run).
The helper exits as the command did: its code, or killed by the same signal.
With `--pty <rows> <cols>` before `--`, the command runs on a terminal of the sandbox's own devpts
(its stdin, stdout and stderr, its controlling terminal); the helper relays the terminal to its
stdin and stdout, and a `WINSIZE <rows> <cols>` control line resizes it.
Usage: sandbox_exec.py <pid> <seccomp program file or -> <uid> <gid> <cwd> [--pty <rows> <cols>] -- <command...>
"""
import ctypes
import fcntl
import os
import resource
import select
import signal
import struct
import sys
import termios
import warnings  # noqa: F401  loaded now: os.execvpe imports it, and the host's files are out of reach inside

# The user namespace last: the others may be owned by an outer one of the sandbox's (bwrap's
# --disable-userns nests one), which the host's root can enter and the inner one's root cannot.
NAMESPACES = [("mnt", 0x00020000), ("uts", 0x04000000), ("ipc", 0x08000000), ("net", 0x40000000),
              ("cgroup", 0x02000000), ("pid", 0x20000000), ("user", 0x10000000)]
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
ENV_FD = 3
CONTROL_FD = 4
STATUS_FD = 5
MAX_CONTROL_LINE = 64

LIBC = ctypes.CDLL(None, use_errno=True)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def report(line):
    try:
        os.write(STATUS_FD, (line.replace("\n", " ") + "\n").encode())
        os.close(STATUS_FD)
    except OSError:
        pass


def fail(message, code=125, kind="sandbox"):
    report(f"ERR {kind} {message}")
    os._exit(code)


def check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        fail(f"{what}: {os.strerror(err)}")


def read_all(fd):
    chunks = []
    while True:
        data = os.read(fd, 65536)
        if not data:
            break
        chunks.append(data)
    os.close(fd)
    return b"".join(chunks)


def parse_env(raw):
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            name, value = item.split(b"=", 1)
            env[name] = value
    return env


def main():
    args = sys.argv[1:]
    pty = None
    if len(args) > 8 and args[5] == "--pty":
        pty = (int(args[6]), int(args[7]))
        args = args[:5] + args[8:]
    if len(args) < 7 or args[5] != "--":
        fail("usage: sandbox_exec.py <pid> <seccomp file> <uid> <gid> <cwd> [--pty <rows> <cols>] -- <command...>", 2)
    pid, seccomp_file, uid, gid, cwd = int(args[0]), args[1], int(args[2]), int(args[3]), args[4]
    command = args[6:]
    env = parse_env(read_all(ENV_FD))
    program = b""
    if seccomp_file != "-":
        with open(seccomp_file, "rb") as f:
            program = f.read()
    # No core file of this helper, whatever signal it re-raises below.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # As the host's root, before any namespace: inside one, setgroups is denied.
    os.setgroups([])
    try:
        fds = [(os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY), name, flag) for name, flag in NAMESPACES]
    except OSError as error:
        fail(f"the sandbox's process is gone ({error.strerror})")
    for fd, name, flag in fds:
        check(LIBC.setns(fd, flag), f"entering the sandbox's {name} namespace")
        os.close(fd)
    # A terminal of the sandbox's own devpts (its /dev/ptmx, in the mount namespace entered).
    master = slave = None
    if pty:
        master, slave = os.openpty()
        resize(master, *pty)
    # Closed by a successful exec (close-on-exec); the child writes why it could not exec instead.
    exec_read, exec_write = os.pipe2(os.O_CLOEXEC)
    child = os.fork()
    if child == 0:
        os.close(exec_read)
        if master is not None:
            os.close(master)
        run(command, env, program, uid, gid, cwd, exec_write, slave)
    os.close(exec_write)
    if slave is not None:
        os.close(slave)
    why = read_all(exec_read)
    report(f"ERR exec {why.decode(errors='replace')}" if why else "OK")
    supervise(child, master)


def resize(master, rows, cols):
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def supervise(child, master=None):
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: send(child, s))
    pidfd = os.pidfd_open(child)
    control = CONTROL_FD
    line = b""
    # With a terminal: its output to stdout, stdin to it (until either ends).
    terminal = master
    keyboard = 0 if master is not None else None
    while True:
        watched = [pidfd] + [fd for fd in (control, terminal, keyboard) if fd is not None]
        try:
            ready, _, _ = select.select(watched, [], [])
        except InterruptedError:
            continue
        if terminal is not None and terminal in ready:
            try:
                data = os.read(terminal, 65536)
            except OSError:
                data = b""
            if data:
                write_all(1, data)
            else:
                terminal = None
            continue
        if keyboard is not None and keyboard in ready:
            data = os.read(keyboard, 65536)
            if data:
                write_all(master, data)
            else:
                keyboard = None
            continue
        if pidfd in ready:
            break
        data = os.read(control, 256)
        if not data:
            # The runtime is gone or done with the command: nothing may run on unsupervised.
            send(child, signal.SIGKILL)
            os.close(control)
            control = None
            continue
        line += data
        while b"\n" in line:
            one, line = line.split(b"\n", 1)
            parts = one.split(b" ")
            if len(parts) == 2 and parts[0] == b"SIG" and parts[1].isdigit():
                send(child, int(parts[1]))
            if len(parts) == 3 and parts[0] == b"WINSIZE" and master is not None:
                if parts[1].isdigit() and parts[2].isdigit():
                    resize(master, min(int(parts[1]), 1000), min(int(parts[2]), 1000))
        if len(line) > MAX_CONTROL_LINE:
            line = b""
    # What the terminal still holds once the command is gone.
    while terminal is not None:
        ready, _, _ = select.select([terminal], [], [], 0.2)
        try:
            data = os.read(terminal, 65536) if ready else b""
        except OSError:
            data = b""
        if not data:
            break
        write_all(1, data)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status))


def send(child, sig):
    # The command leads a process group of its own: what it started gets the signal too.
    try:
        os.killpg(child, sig)
    except ProcessLookupError:
        pass


def run(command, env, program, uid, gid, cwd, exec_write, terminal=None):
    def refuse(message, code):
        os.write(exec_write, message.encode())
        os._exit(code)

    try:
        os.close(CONTROL_FD)
        os.close(STATUS_FD)
        os.setsid()
        if terminal is not None:
            # Its controlling terminal, and its stdin, stdout and stderr.
            fcntl.ioctl(terminal, termios.TIOCSCTTY, 0)
            for fd in (0, 1, 2):
                os.dup2(terminal, fd)
            os.close(terminal)
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        # After the uid change, which clears it: the command never outlives this helper.
        if LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            refuse("prctl(PDEATHSIG) failed", 125)
        # The parent is outside the pid namespace (seen as 0); a reaper inside means it is gone.
        if os.getppid() != 0:
            os._exit(137)
        try:
            os.chdir(cwd)
        except OSError as error:
            refuse(f"cwd {cwd}: {error.strerror}", 126)
        if LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            refuse("prctl(NO_NEW_PRIVS) failed", 125)
        if program:
            buf = ctypes.create_string_buffer(program, len(program))
            prog = SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
            if LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
                refuse("loading the seccomp filter failed", 125)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        os.execvpe(command[0], command, env)
    except OSError as error:
        refuse(f"{command[0]}: {error.strerror}", 127 if error.errno == 2 else 126)


if __name__ == "__main__":
    main()
