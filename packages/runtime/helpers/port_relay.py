"""Cairn's port relay: reaches TCP ports on a sandbox's loopback for previews.

A sandbox's network namespace has loopback only, so nothing on the host can connect to a service
it runs. One relay per sandbox (started on the first preview request) binds a unix socket on the
host, then enters the sandbox's network namespace and drops to an unprivileged uid. Each client
writes `CONNECT <port>\n`; the relay answers `OK\n` once it is connected to 127.0.0.1:<port> inside
(or `ERR <reason>\n`), then relays bytes both ways until both sides are done.
Usage: port_relay.py <netns path> <socket path> <uid>
"""
import ctypes
import encodings.idna  # noqa: F401  loaded now: the interpreter's files may be unreadable after setuid
import os
import signal
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
MAX_LINE = 64


LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent):
    # Set after the uid change, which clears it: a relay must never outlive the runtime.
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        sys.exit(0)


def enter_netns(path):
    libc = LIBC
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)


def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        # Half-close: the other direction may still have bytes to deliver (a response after EOF).
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def read_line(conn):
    line = b""
    while not line.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk or len(line) > MAX_LINE:
            return None
        line += chunk
    return line.decode("ascii", "replace").strip()


def handle(client):
    upstream = None
    try:
        line = read_line(client)
        parts = line.split(" ") if line else []
        if len(parts) != 2 or parts[0] != "CONNECT" or not parts[1].isdigit():
            client.sendall(b"ERR bad_request\n")
            return
        port = int(parts[1])
        if not 1 <= port <= 65535:
            client.sendall(b"ERR bad_request\n")
            return
        try:
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            upstream.settimeout(5)
            upstream.connect(("127.0.0.1", port))
            upstream.settimeout(None)
        except OSError as e:
            name = "refused" if isinstance(e, ConnectionRefusedError) else type(e).__name__
            client.sendall(("ERR %s\n" % name).encode())
            return
        client.sendall(b"OK\n")
        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join()
    except Exception:
        pass
    finally:
        for s in (client, upstream):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass


def main():
    parent = os.getppid()
    netns, socket_path, uid = sys.argv[1], sys.argv[2], int(sys.argv[3])
    try:
        os.unlink(socket_path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    listener.bind(socket_path)
    os.umask(old)
    listener.listen(128)
    enter_netns(netns)
    # Connecting to loopback needs no privilege: the relay keeps none.
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    die_with_parent(parent)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        client, _ = listener.accept()
        threading.Thread(target=handle, args=(client,), daemon=True).start()


if __name__ == "__main__":
    main()
