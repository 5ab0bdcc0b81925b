import type http from 'node:http'

/** Headers about one connection, not the message (RFC 9110 7.6.1, RFC 9112 and proxies' own). */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
])

/**
 * The headers of a message that go on to the next hop: all but the hop-by-hop ones and those the
 * sender names in `Connection`. Each side of the proxy has its own connection (kept alive or
 * closed as that side asks): relaying the other side's `Connection: keep-alive` would keep a
 * connection open that its client meant to close, and the client's next request would land on it.
 */
export function endToEndHeaders(
  headers: http.IncomingHttpHeaders | http.OutgoingHttpHeaders,
): http.OutgoingHttpHeaders {
  const named = new Set(
    [headers.connection ?? []]
      .flat()
      .flatMap((value) => String(value).split(','))
      .map((token) => token.trim().toLowerCase()),
  )
  const out: http.OutgoingHttpHeaders = {}
  for (const [name, value] of Object.entries(headers)) {
    const lower = name.toLowerCase()
    if (value === undefined || HOP_BY_HOP.has(lower) || named.has(lower)) continue
    out[name] = value
  }
  return out
}

/**
 * The end-to-end headers of a request, framed for the next hop: a body that came chunked goes on
 * chunked (Node would otherwise send a GET's body with no framing at all); a length stays.
 */
export function forwardedRequestHeaders(
  original: http.IncomingHttpHeaders,
  headers: http.OutgoingHttpHeaders,
): http.OutgoingHttpHeaders {
  const out = endToEndHeaders(headers)
  if (original['transfer-encoding'] !== undefined) {
    delete out['content-length']
    out['transfer-encoding'] = 'chunked'
  }
  return out
}
