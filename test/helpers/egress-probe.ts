import type { ChildProcess } from 'node:child_process'
import dgram from 'node:dgram'
import net from 'node:net'
import { createNetnsHost, type NetnsHost, netnsAddresses } from './netns.js'

/**
 * An egress test bed (issue 28 items 9, 13, 14): a test host in its own namespace answers HTTP on
 * 8080 with the Host and path it was asked for, and echoes on 8443 (keeping every connection
 * open); a DNS server on loopback answers `fastName` and never answers the names under `slow`.
 * `probe` is an agent (python) that drives the sandbox's egress proxy a line at a time.
 */
export interface EgressBed {
  host: NetnsHost
  /** The test host's address. */
  address: string
  fastName: string
  slow: string
  /** Every name the DNS server was asked for, in order. */
  asked: string[]
  /** `host:port` of the DNS server. */
  dnsServer: string
  probe: string
  close(): void
}

export async function startEgressBed(tag: string, subnet: number): Promise<EgressBed> {
  const { address } = netnsAddresses(subnet)
  const fastName = `fast-${process.pid}.cairn.test`
  const slow = `slow-${process.pid}.cairn.test`
  const host = createNetnsHost(tag, subnet)
  const web: ChildProcess = host.spawn(
    [
      process.execPath,
      '-e',
      `require("net").createServer((s) => s.pipe(s)).listen(8443, "${address}")
       require("http").createServer((req, res) => res.end("hello from the test host: " + req.headers.host + " " + req.url + "\\n")).listen(8080, "${address}")`,
    ],
    { stdio: 'ignore' },
  )
  for (let i = 0; i < 100 && !(await reachable(address, 8080)); i++)
    await new Promise((r) => setTimeout(r, 50))
  const asked: string[] = []
  const dns = dgram.createSocket('udp4')
  dns.on('message', (query, peer) => {
    const { name, reply } = answerQuery(query, { address, fastName, slow })
    asked.push(name)
    if (reply) dns.send(reply, peer.port, peer.address)
  })
  await new Promise<void>((resolve) => dns.bind(0, '127.0.0.1', resolve))
  return {
    host,
    address,
    fastName,
    slow,
    asked,
    dnsServer: `127.0.0.1:${dns.address().port}`,
    probe: probeScript(slow),
    close() {
      dns.close()
      web.kill('SIGKILL')
      host.remove()
    },
  }
}

/** Whether `address`'s `port` takes connections yet. */
const reachable = (address: string, port: number) =>
  new Promise<boolean>((resolve) => {
    const socket = net.connect(port, address)
    socket.once('connect', () => {
      socket.destroy()
      resolve(true)
    })
    socket.once('error', () => resolve(false))
  })

/** The question's name of a DNS query, and an answer: `fastName`'s A record, NXDOMAIN, or none. */
function answerQuery(
  query: Buffer,
  bed: { address: string; fastName: string; slow: string },
): { name: string; reply: Buffer | undefined } {
  const labels: string[] = []
  let at = 12
  while (at < query.length && query[at] !== 0) {
    const length = query[at] ?? 0
    labels.push(query.subarray(at + 1, at + 1 + length).toString('latin1'))
    at += 1 + length
  }
  const name = labels.join('.').toLowerCase()
  const questionEnd = at + 5
  const type = query.readUInt16BE(at + 1)
  if (name.endsWith(bed.slow)) return { name, reply: undefined }
  const found = name === bed.fastName && type === 1
  const header = Buffer.alloc(12)
  query.copy(header, 0, 0, 2)
  header.writeUInt16BE(found || name === bed.fastName ? 0x8180 : 0x8183, 2)
  header.writeUInt16BE(1, 4)
  header.writeUInt16BE(found ? 1 : 0, 6)
  const record = Buffer.from([
    0xc0,
    0x0c,
    0,
    1,
    0,
    1,
    0,
    0,
    0,
    60,
    0,
    4,
    ...bed.address.split('.').map(Number),
  ])
  return {
    name,
    reply: Buffer.concat([header, query.subarray(12, questionEnd), found ? record : Buffer.alloc(0)]),
  }
}

/** The probe agent's program: a command a line (`connect`, `get`, `hoard`, `flood`, `echo`, …). */
function probeScript(SLOW: string): string {
  return [
    'import re, socket, threading, urllib.request',
    'held = []',
    'flood = []',
    // A CONNECT through the sandbox's proxy, then `payload`; the status line and what came back.
    'def connect(target, payload=b"", keep=False, timeout=5):',
    '    try:',
    '        s = socket.create_connection(("127.0.0.1", 3128), timeout=timeout)',
    '        s.sendall(("CONNECT %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % (target, target)).encode())',
    '        reply = s.recv(4096).decode(errors="replace")',
    '        status = reply.split("\\r\\n")[0] if reply else "ERR closed"',
    '        if keep: held.append(s); return status',
    '        if payload and status.endswith(" 200 Connection Established"):',
    '            s.sendall(payload)',
    '            s.settimeout(2)',
    '            back = b""',
    '            try:',
    '                while True:',
    '                    chunk = s.recv(4096)',
    '                    if not chunk: break',
    '                    back += chunk',
    '            except Exception: pass',
    '            seen = re.findall(r"HTTP/1\\.[01] \\d+|hello from the test host: \\S+ \\S+", back.decode(errors="replace"))',
    '            status += " | " + (" | ".join(seen) if seen else "closed")',
    '        s.close()',
    '        return status',
    '    except Exception as e:',
    '        return "ERR " + type(e).__name__',
    'def get(url):',
    '    try:',
    '        return urllib.request.urlopen(url, timeout=5).read().decode().strip()',
    '    except Exception as e:',
    '        return "ERR " + str(e)[:80]',
    'def hoard(n, target):',
    '    codes = [connect(target, keep=True).split(" ")[1] for _ in range(n)]',
    '    return " ".join("%s x%d" % (c, codes.count(c)) for c in sorted(set(codes)))',
    'def start_flood(n):',
    '    for i in range(n):',
    '        threading.Thread(target=lambda i=i: flood.append(connect("n%d.' +
      SLOW +
      ':8443" % i, timeout=None)), daemon=True).start()',
    '    return "started"',
    'while True:',
    '    kind, _, arg = input().partition(" ")',
    '    if kind == "connect": print(connect(arg))',
    '    elif kind == "get": print(get(arg))',
    '    elif kind == "echo": print(arg)',
    '    elif kind == "hoard": n, target = arg.split(" "); print(hoard(int(n), target))',
    '    elif kind == "release": [s.close() for s in held]; held.clear(); print("released")',
    '    elif kind == "flood": print(start_flood(int(arg)))',
    '    elif kind == "answered": print(len(flood))',
    '    elif kind == "pipelined": print(connect(arg, ("GET /one HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % arg + "GET /two HTTP/1.1\\r\\nHost: evil.example\\r\\nConnection: close\\r\\n\\r\\n").encode()))',
    // An SSLv2-format ClientHello: a two-byte length with the high bit, type 1, version 3.1.
    '    elif kind == "sslv2": print(connect(arg, bytes([0x80, 0x2e, 0x01, 0x03, 0x01, 0, 0x15, 0, 0, 0, 0x10]) + bytes(0x2e - 9)))',
  ].join('\n')
}
