"""Cairn egress forwarder, started inside a sandbox that has an allowlist.

The sandbox's network namespace has only loopback. This listens on 127.0.0.1:3128 (the address
HTTP_PROXY/HTTPS_PROXY point to) and relays every connection to the runtime's egress proxy
through the unix socket in /run/cairn; the proxy decides what may go out. Then it execs the agent.
Usage: forward.py -- command args...
"""
import os
import signal
import socket
import sys
import threading

SOCKET = "/run/cairn/egress.sock"
PORT = 3128


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(listener):
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(SOCKET)
        except OSError:
            client.close()
            continue
        threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()


def main():
    args = sys.argv[1:]
    if args and args[0] == "--":
        args = args[1:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", PORT))
    listener.listen(64)
    pid = os.fork()
    if pid == 0:
        # The forwarder: no stdio of the agent's, and it ends with the sandbox's pid namespace.
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1):
            os.dup2(devnull, fd)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        serve(listener)
        os._exit(0)
    listener.close()
    os.execvp(args[0], args)


if __name__ == "__main__":
    main()
