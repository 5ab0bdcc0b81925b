import http from 'node:http'
import net from 'node:net'

/**
 * `fetch` for preview URLs. Previews live on `<port>-<session>.localhost`, which browsers resolve to
 * loopback on their own but Node's resolver does not: such a URL is sent to 127.0.0.1 with its own
 * `Host`. Other URLs go through `fetch` unchanged. Redirects are never followed.
 */
export async function previewFetch(
  url: string,
  /** `host`: sent as the `Host` header instead of the URL's (the URL's host is connected to). */
  init: { method?: string; headers?: Record<string, string>; body?: string; host?: string } = {},
): Promise<Response> {
  const target = new URL(url)
  const local = target.hostname.endsWith('.localhost')
  if (!local && init.host === undefined) {
    return fetch(url, { ...init, redirect: 'manual' })
  }
  return new Promise((resolve, reject) => {
    const request = http.request(
      {
        host: local ? '127.0.0.1' : target.hostname,
        port: Number(target.port || 80),
        method: init.method ?? 'GET',
        path: `${target.pathname}${target.search}`,
        headers: { ...init.headers, host: init.host ?? target.host },
      },
      (res) => {
        const chunks: Buffer[] = []
        res.on('data', (chunk: Buffer) => chunks.push(chunk))
        res.on('error', reject)
        res.on('end', () => {
          const headers = new Headers()
          for (const [name, value] of Object.entries(res.headers)) {
            for (const v of Array.isArray(value) ? value : value === undefined ? [] : [value]) {
              headers.append(name, v)
            }
          }
          const body = [101, 204, 304].includes(res.statusCode ?? 0) ? null : Buffer.concat(chunks)
          resolve(new Response(body, { status: res.statusCode ?? 0, headers }))
        })
      },
    )
    request.on('error', reject)
    request.end(init.body)
  })
}

/** Where a raw socket must connect to reach a preview URL (`*.localhost` is loopback). */
export function previewSocketAddress(url: string): { host: string; port: number } {
  const target = new URL(url)
  const host = target.hostname.endsWith('.localhost') ? '127.0.0.1' : target.hostname
  return { host, port: Number(target.port || 80) }
}

/** The origin of a session port's previews on a test server's preview listener (default domain). */
export function previewOrigin(previewPort: number, sessionId: string, port: number): string {
  return `http://${port}-${sessionId.replace('_', '-')}.localhost:${previewPort}`
}

/**
 * A raw-socket server for a sandbox (python3, port 8001) that answers any request with 101, reports
 * whether it saw an API key (`saw-key: yes|no`), then echoes: enough to show an Upgrade handshake
 * and the bytes after it are relayed.
 */
export const UPGRADE_ECHO_PY = [
  'import socket',
  's = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)',
  's.bind(("127.0.0.1", 8001)); s.listen(4)',
  'while True:',
  '    c, _ = s.accept(); head = b""; more = b"."',
  '    while more and b"\\r\\n\\r\\n" not in head: more = c.recv(1024); head += more',
  '    if not more: c.close(); continue',
  '    saw = b"yes" if b"authorization" in head.lower() else b"no"',
  '    c.sendall(b"HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: echo\\r\\nConnection: Upgrade\\r\\n\\r\\nsaw-key: " + saw + b"\\n")',
  '    while True:',
  '        d = c.recv(1024)',
  '        if not d: break',
  '        c.sendall(d)',
  '    c.close()',
].join('\n')

/** An Upgrade (`Upgrade: echo`) asked of a signed preview URL over a raw socket. */
export interface RawUpgrade {
  socket: net.Socket
  /** Everything received so far, the answer's head included. */
  received(): string
  closed(): boolean
}

export function rawPreviewUpgrade(url: string, file = 'ws'): RawUpgrade {
  const target = new URL(url)
  const address = previewSocketAddress(url)
  const socket = net.connect(address.port, address.host)
  let received = ''
  let closed = false
  socket.on('data', (chunk) => {
    received += chunk.toString()
  })
  socket.on('error', () => undefined)
  socket.on('close', () => {
    closed = true
  })
  socket.write(
    `GET ${target.pathname}${file}${target.search} HTTP/1.1\r\nHost: ${target.host}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n`,
  )
  return { socket, received: () => received, closed: () => closed }
}
