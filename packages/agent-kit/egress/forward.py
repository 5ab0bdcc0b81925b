"""Cairn egress forwarder, started inside a sandbox that has an allowlist.

It listens on 127.0.0.1:3128 (the address HTTP_PROXY/HTTPS_PROXY point to) and relays every
connection to the runtime's egress proxy through the unix socket in /run/cairn; the proxy decides
what may go out. Then it execs the agent.

With --transparent PATTERNS (drivers whose sandbox network redirects TCP and DNS here, see
packages/runtime/src/egress/transparent.ts) it also:
- answers DNS on 127.0.0.1:3153 (UDP and TCP): an A query for a name the allowlist's host
  patterns (comma-separated: `api.example.com`, `*.example.com`) allow gets a stand-in address
  from 198.18.0.0/15, kept for the life of the sandbox; other names get NXDOMAIN, other types of
  an allowed name an empty answer;
- accepts the redirected TCP connections on 127.0.0.1:3129, reads where each was going
  (SO_ORIGINAL_DST) and asks the proxy for `CONNECT <name>:<port>` (the name behind a stand-in
  address) or `CONNECT <ip>:<port>`; a plain HTTP request goes as a proxy request for
  `http://<name>:<port>/...` instead (one per connection), so the proxy's allowlist, method rules,
  address checks and proxy secrets apply exactly as for a client that uses the proxy variables.
Usage: forward.py [--transparent PATTERNS] -- command args...
"""
import os
import select
import signal
import socket
import struct
import sys
import threading

SOCKET = "/run/cairn/egress.sock"
PORT = 3128
TRANSPARENT_PORT = 3129
DNS_PORT = 3153
SO_ORIGINAL_DST = 80
# Stand-in addresses: 198.18.0.1 is the nameserver and 198.18.0.2 the sandbox itself.
FIRST_STAND_IN = struct.unpack("!I", socket.inet_aton("198.18.1.0"))[0]
LAST_STAND_IN = struct.unpack("!I", socket.inet_aton("198.19.255.254"))[0]
TTL_S = 300
# How long a redirected connection may stay silent before it is taken for a server-first protocol.
CLIENT_FIRST_WAIT_S = 1.0
MAX_HEAD = 256 * 1024
HOP_HEADERS = {b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization"}


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


def relay(client, upstream):
    threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
    threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()


def serve(listener):
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(SOCKET)
        except OSError:
            client.close()
            continue
        relay(client, upstream)


class Names:
    """Allowed names and their stand-in addresses, both ways."""

    def __init__(self, patterns):
        self.patterns = [p.strip().lower() for p in patterns.split(",") if p.strip()]
        self.by_name = {}
        self.by_address = {}
        self.next = FIRST_STAND_IN
        self.lock = threading.Lock()

    def allowed(self, name):
        for pattern in self.patterns:
            if pattern == name:
                return True
            if pattern.startswith("*.") and name.endswith(pattern[1:]) and len(name) > len(pattern) - 1:
                return True
        return False

    def address_for(self, name):
        with self.lock:
            address = self.by_name.get(name)
            if address is None and self.next <= LAST_STAND_IN:
                address = socket.inet_ntoa(struct.pack("!I", self.next))
                self.next += 1
                self.by_name[name] = address
                self.by_address[address] = name
            return address

    def name_for(self, address):
        with self.lock:
            return self.by_address.get(address)


def parse_question(query):
    """(name, qtype, end of the question) of a DNS query, or None when it is not one."""
    if len(query) < 12 or struct.unpack("!H", query[4:6])[0] != 1:
        return None
    labels = []
    at = 12
    while True:
        if at >= len(query):
            return None
        length = query[at]
        at += 1
        if length == 0:
            break
        if length > 63 or at + length > len(query):
            return None
        labels.append(query[at : at + length].decode("ascii", "replace"))
        at += length
    if at + 4 > len(query):
        return None
    qtype = struct.unpack("!H", query[at : at + 2])[0]
    return ".".join(labels).lower().rstrip("."), qtype, at + 4


def answer(query, names):
    question = parse_question(query)
    if question is None:
        if len(query) < 12:
            return None
        # FORMERR, the header echoed.
        return query[:2] + struct.pack("!HHHHH", 0x8001, 0, 0, 0, 0)
    name, qtype, end = question
    flags = 0x8180 | (struct.unpack("!H", query[2:4])[0] & 0x0100)  # response, RD copied, RA
    records = b""
    count = 0
    if not names.allowed(name):
        flags |= 3  # NXDOMAIN: the proxy would refuse the name anyway
    elif qtype == 1:
        address = names.address_for(name)
        if address is None:
            flags |= 2  # SERVFAIL: out of stand-in addresses
        else:
            records = struct.pack("!HHHIH", 0xC00C, 1, 1, TTL_S, 4) + socket.inet_aton(address)
            count = 1
    return query[:2] + struct.pack("!HHHHH", flags, 1, count, 0, 0) + query[12:end] + records


def serve_dns_udp(sock, names):
    while True:
        try:
            query, peer = sock.recvfrom(4096)
            reply = answer(query, names)
            if reply is not None:
                sock.sendto(reply, peer)
        except OSError:
            pass


def read_exactly(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def serve_dns_tcp_client(conn, names):
    try:
        while True:
            head = read_exactly(conn, 2)
            if head is None:
                break
            query = read_exactly(conn, struct.unpack("!H", head)[0])
            reply = answer(query or b"", names)
            if reply is None:
                break
            conn.sendall(struct.pack("!H", len(reply)) + reply)
    except OSError:
        pass
    finally:
        conn.close()


def serve_dns_tcp(listener, names):
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve_dns_tcp_client, args=(conn, names), daemon=True).start()


def refuse(client):
    # A reset rather than a clean close: the client sees the connection refused, not an empty answer.
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    client.close()


def looks_like_http(first):
    """Whether a connection's first bytes start a request line (`GET `, `OPTIONS `...)."""
    method, space, _ = first.partition(b" ")
    return bool(space) and 3 <= len(method) <= 10 and method.isalpha() and method.isupper()


def read_head(client):
    """The request line and headers of a plain HTTP request, or None when they never end."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = client.recv(65536)
        if not chunk or len(head) > MAX_HEAD:
            return None
        head += chunk
    return head


def as_proxy_request(head, target):
    """The request in the form a proxy takes (absolute URL), one request per connection."""
    lines, _, body = head.partition(b"\r\n\r\n")
    lines = lines.split(b"\r\n")
    method, _, rest = lines[0].partition(b" ")
    path, _, version = rest.partition(b" ")
    if not path.startswith(b"/"):
        return None
    kept = [line for line in lines[1:] if line.split(b":", 1)[0].strip().lower() not in HOP_HEADERS]
    request_line = b"%s http://%s%s %s" % (method, target.encode(), path, version)
    return b"\r\n".join([request_line, *kept, b"Connection: close"]) + b"\r\n\r\n" + body


def connect_through_proxy(client, names):
    try:
        original = client.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        port, packed = struct.unpack("!2xH4s8x", original)
        address = socket.inet_ntoa(packed)
        host = names.name_for(address) or address
        target = "%s:%d" % (host, port)
        # Plain HTTP goes to the proxy as a proxy request (method rules and proxy secrets apply
        # as for a client that uses HTTP_PROXY); anything else (TLS, or a protocol where the
        # server speaks first) as a CONNECT tunnel, which the proxy may terminate for a secret.
        ready, _, _ = select.select([client], [], [], CLIENT_FIRST_WAIT_S)
        first = client.recv(8, socket.MSG_PEEK) if ready else b""
        request = None
        if looks_like_http(first):
            head = read_head(client)
            request = as_proxy_request(head, target) if head is not None else None
            if request is None:
                refuse(client)
                return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(SOCKET)
        if request is not None:
            upstream.sendall(request)
            relay(client, upstream)
            return
        upstream.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = upstream.recv(4096)
            if not chunk or len(response) > 65536:
                break
            response += chunk
        head, _, rest = response.partition(b"\r\n\r\n")
        status = head.split(b" ", 2)
        if len(status) < 2 or status[1] != b"200":
            upstream.close()
            refuse(client)
            return
        if rest:
            client.sendall(rest)
        relay(client, upstream)
    except OSError:
        refuse(client)


def serve_transparent(listener, names):
    while True:
        client, _ = listener.accept()
        threading.Thread(target=connect_through_proxy, args=(client, names), daemon=True).start()


def listen(kind, port):
    sock = socket.socket(socket.AF_INET, kind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    if kind == socket.SOCK_STREAM:
        sock.listen(128)
    return sock


def main():
    args = sys.argv[1:]
    patterns = None
    if len(args) >= 2 and args[0] == "--transparent":
        patterns = args[1]
        args = args[2:]
    if args and args[0] == "--":
        args = args[1:]
    # Every socket is bound before the agent starts: its first connection finds them listening.
    listener = listen(socket.SOCK_STREAM, PORT)
    extra = []
    if patterns is not None:
        names = Names(patterns)
        extra = [
            (serve_transparent, listen(socket.SOCK_STREAM, TRANSPARENT_PORT), names),
            (serve_dns_udp, listen(socket.SOCK_DGRAM, DNS_PORT), names),
            (serve_dns_tcp, listen(socket.SOCK_STREAM, DNS_PORT), names),
        ]
    pid = os.fork()
    if pid == 0:
        # The forwarder: no stdio of the agent's, and it ends with the sandbox's pid namespace.
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1):
            os.dup2(devnull, fd)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for target, sock, names in extra:
            threading.Thread(target=target, args=(sock, names), daemon=True).start()
        serve(listener)
        os._exit(0)
    listener.close()
    for _, sock, _ in extra:
        sock.close()
    os.execvp(args[0], args)


if __name__ == "__main__":
    main()
