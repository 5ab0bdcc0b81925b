import { existsSync } from 'node:fs'
import net from 'node:net'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
// @ts-expect-error: a plain ESM build script without type declarations
import { buildConsole } from '../../packages/console/build.mjs'
import { type Browser, CHROMIUM, launchBrowser } from '../console/browser.js'
import { previewFetch, previewOrigin, previewSocketAddress } from '../helpers/preview.js'
import type { TestServer } from '../helpers/server.js'
import { startShellServer } from '../helpers/shell-server.js'

/**
 * A hostile preview. The page a session's agent serves tries to reach the console's API key (kept
 * in the console's sessionStorage) and the API: it reads every storage it can see, opens the
 * console and reads that window's storage, fetches the API with credentials (and with whatever key
 * it found), and registers a service worker for `/` (its script under /static/, the scope allowed
 * by its own `Service-Worker-Allowed: /`), and reads another preview (port 8001, whose service lets
 * any origin read it with credentials) with that preview's cookie. Its server also plants cookies for `/` and for the whole
 * `localhost` domain, forges Cairn's own preview cookie, and asks for no opener isolation.
 */
const PAGE = `<!doctype html><html><head><meta charset="utf-8"><title>hostile</title></head><body>
<script>
const results = {}
const note = (name, attempt) => attempt().then(
  (value) => { results[name] = value },
  (error) => { results[name] = 'error: ' + error.name + ': ' + error.message },
)
const api = new URLSearchParams(location.hash.slice(1)).get('api')
const sibling = new URLSearchParams(location.hash.slice(1)).get('sibling')
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
async function attack() {
  results.origin = location.origin
  results.sessionStorage = JSON.stringify(Object.assign({}, sessionStorage))
  results.localStorage = JSON.stringify(Object.assign({}, localStorage))
  results.cookie = document.cookie
  const stolen = Object.values(Object.assign({}, sessionStorage, localStorage)).find((v) => String(v).length > 20) || ''
  await note('apiWithFoundKey', async () => {
    const res = await fetch(api + '/v1/sessions', { credentials: 'include', headers: stolen ? { authorization: 'Bearer ' + stolen } : {} })
    return 'status ' + res.status
  })
  await note('apiWithCredentials', async () => {
    const res = await fetch(api + '/v1/sessions', { credentials: 'include' })
    return 'status ' + res.status
  })
  await note('openedConsole', async () => {
    const w = window.open(api + '/', 'console')
    await sleep(500)
    try { return JSON.stringify(Object.assign({}, w.sessionStorage)) } finally { w.close() }
  })
  await note('serviceWorkerForRoot', async () => {
    await navigator.serviceWorker.register('static/sw.js', { scope: '/' })
    return 'registered'
  })
  await note('serviceWorkerForItsDirectory', async () => {
    await navigator.serviceWorker.register('static/sw.js', { scope: './static/' })
    return 'registered'
  })
  await note('siblingWithItsCookie', async () => {
    const res = await fetch(sibling + '/secret', { credentials: 'include' })
    return 'status ' + res.status + ': ' + (await res.text())
  })
  window.results = results
  document.title = 'done'
}
attack()
</script></body></html>`

const SERVICE_WORKER =
  "self.addEventListener('fetch', (e) => e.respondWith(new Response('owned by the preview')))"

const HOSTILE_HEADERS = [
  ['Service-Worker-Allowed', '/'],
  ['Set-Cookie', 'planted=1; Path=/'],
  ['Set-Cookie', 'tossed=1; Path=/; Domain=localhost'],
  ['Set-Cookie', 'cairn_preview=forged; Path=/'],
  ['Cross-Origin-Opener-Policy', 'unsafe-none'],
  ['Origin-Agent-Cluster', '?0'],
]

// The hostile service on port 8000; `/ws` answers an Upgrade with the same headers, then echoes.
const HOSTILE_SERVER = `import http.server, sys
PAGES = {"/": ("text/html", ${JSON.stringify(PAGE)}), "/static/sw.js": ("text/javascript", ${JSON.stringify(SERVICE_WORKER)})}
HOSTILE = ${JSON.stringify(HOSTILE_HEADERS)}
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/secret":
            # A service that trusts its cookie and lets any origin read it with credentials.
            body = ("secret of port %d" % PORT).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Access-Control-Allow-Origin", self.headers.get("Origin") or "*")
            self.send_header("Access-Control-Allow-Credentials", "true")
            self.end_headers(); self.wfile.write(body)
            return
        if path == "/ws":
            self.send_response(101)
            self.send_header("Upgrade", "echo")
            self.send_header("Connection", "Upgrade")
            for name, value in HOSTILE: self.send_header(name, value)
            self.end_headers(); self.wfile.flush()
            while True:
                data = self.connection.recv(1024)
                if not data: break
                self.connection.sendall(data)
            self.close_connection = True
            return
        page = PAGES.get(path)
        if page is None:
            self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers(); return
        body = page[1].encode()
        self.send_response(200)
        self.send_header("Content-Type", page[0])
        self.send_header("Content-Length", str(len(body)))
        for name, value in HOSTILE: self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)
PORT = int(sys.argv[1])
http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
`

let t: TestServer
let sessionId = ''

const signedUrl = async (port = 8000) => {
  const res = await t.api.call('POST', `/v1/sessions/${sessionId}/ports/${port}/url`, { ttlMs: 600_000 })
  expect(res.status).toBe(200)
  return res.body.url as string
}

beforeAll(async () => {
  t = await startShellServer({}, { files: { 'hostile.py': HOSTILE_SERVER } })
  sessionId = (await t.api.createSession('shell')).id
  const started = await t.api.send(
    sessionId,
    [8000, 8001]
      .map(
        (port) =>
          `(nohup python3 hostile.py ${port} >/tmp/hostile-${port}.log 2>&1 &) && for i in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1', ${port}))" 2>/dev/null && break; sleep 0.05; done`,
      )
      .join(' && '),
  )
  expect(started.text).toContain('[exit 0]')
})

afterAll(async () => {
  await t?.close()
})

describe('previews on their own origin', () => {
  it('hands out preview URLs on a per-preview origin, never the API and console origin', async () => {
    const url = new URL(await signedUrl())
    expect(url.origin).not.toBe(new URL(t.url).origin)
    expect(url.origin).toBe(previewOrigin(t.server.previewPort, sessionId, 8000))
    const other = await t.api.call('POST', `/v1/sessions/${sessionId}/ports/8001/url`, { ttlMs: 60_000 })
    expect(new URL(other.body.url).origin).not.toBe(url.origin)
  })

  it('serves no preview content on the API listener, with a key or a signed URL', async () => {
    const withKey = await fetch(`${t.url}/v1/sessions/${sessionId}/ports/8000/`, {
      headers: { authorization: `Bearer ${t.key}` },
      redirect: 'manual',
    })
    expect(await withKey.text()).not.toContain('hostile')
    expect(withKey.status).toBe(308)
    const signed = new URL(await signedUrl())
    const old = await fetch(`${t.url}/v1/sessions/${sessionId}/ports/8000/static/sw.js${signed.search}`, {
      redirect: 'manual',
    })
    expect(old.status).toBe(308)
    expect(await old.text()).not.toContain('owned by the preview')
    // Old path-style links land on the preview's own origin.
    expect(old.headers.get('location')).toBe(`${signed.origin}/static/sw.js${signed.search}`)
    // No Upgrade is relayed on the API listener either.
    const api = new URL(t.url)
    const head = await rawUpgrade(
      { host: api.hostname, port: Number(api.port) },
      `/v1/sessions/${sessionId}/ports/8000/ws`,
      api.host,
      `authorization: Bearer ${t.key}\r\n`,
    )
    expect(head).not.toMatch(/^HTTP\/1\.1 101 /)
  })

  it('serves previews only on the hosts that name them, never on the bare preview listener', async () => {
    const listener = `http://127.0.0.1:${t.server.previewPort}`
    const own = new URL(await signedUrl())
    for (const host of ['127.0.0.1', 'localhost', 'rebound.example.test', `${own.hostname}.example.test`]) {
      const res = await fetch(`${listener}/${own.search}`, {
        headers: { authorization: `Bearer ${t.key}`, host },
      })
      const text = await res.text()
      expect(res.status, host).toBe(404)
      expect(text, host).not.toContain('hostile')
      expect(JSON.parse(text).error.code).toBe('not_found')
    }
  })

  it('takes the preview cookie only on requests of its own pages, and plain navigations to it', async () => {
    const url = new URL(await signedUrl())
    const first = await previewFetch(url.href)
    const cookie =
      (first.headers.getSetCookie().find((c) => c.startsWith('cairn_preview=')) ?? '').split(';')[0] ?? ''
    const get = async (metadata: Record<string, string>, method = 'GET') =>
      (await previewFetch(`${url.origin}/secret`, { method, headers: { cookie, ...metadata } })).status
    expect(await get({})).toBe(200)
    expect(await get({ 'sec-fetch-site': 'same-origin', 'sec-fetch-mode': 'cors' })).toBe(200)
    expect(await get({ 'sec-fetch-site': 'none', 'sec-fetch-mode': 'navigate' })).toBe(200)
    expect(await get({ 'sec-fetch-site': 'cross-site', 'sec-fetch-mode': 'navigate' })).toBe(200)
    // A sibling preview (same site under an operator's preview domain) or any site, from a script,
    // an image or a form post: not with the user's cookie.
    expect(await get({ 'sec-fetch-site': 'same-site', 'sec-fetch-mode': 'cors' })).toBe(403)
    expect(await get({ 'sec-fetch-site': 'cross-site', 'sec-fetch-mode': 'no-cors' })).toBe(403)
    expect(await get({ 'sec-fetch-site': 'same-site', 'sec-fetch-mode': 'navigate' }, 'POST')).toBe(403)
    const refused = await previewFetch(`${url.origin}/secret`, {
      headers: { cookie, 'sec-fetch-site': 'same-site', 'sec-fetch-mode': 'cors' },
    })
    expect(await refused.json()).toMatchObject({
      error: { code: 'forbidden', details: { reason: 'foreign_request' } },
    })
    const ws = await rawUpgrade(
      previewSocketAddress(url.href),
      '/ws',
      url.host,
      `cookie: ${cookie}\r\nsec-fetch-site: same-site\r\nsec-fetch-mode: websocket\r\n`,
    )
    expect(ws).toMatch(/^HTTP\/1\.1 403 /)
  })

  it("strips the preview's headers that reach beyond its origin, and forces opener isolation", async () => {
    const url = await signedUrl()
    const res = await previewFetch(url)
    expect(res.status).toBe(200)
    expect(await res.text()).toContain('hostile')
    expect(res.headers.get('service-worker-allowed')).toBeNull()
    const cookies = res.headers.getSetCookie()
    expect(cookies).toContain('planted=1; Path=/')
    expect(cookies.join('\n')).not.toMatch(/domain=/i)
    expect(cookies.filter((c) => c.startsWith('cairn_preview=forged'))).toEqual([])
    expect(cookies.find((c) => c.startsWith('tossed=1'))).toBe('tossed=1; Path=/')
    expect(cookies.find((c) => c.startsWith('cairn_preview='))).toMatch(/; Path=\/; .*HttpOnly/)
    expect(res.headers.get('cross-origin-opener-policy')).toBe('same-origin-allow-popups')
    expect(res.headers.get('origin-agent-cluster')).toBe('?1')
  })

  it("strips the same headers from an Upgrade's handshake, and relays the bytes after it", async () => {
    const url = new URL(await signedUrl())
    const head = await rawUpgrade(
      previewSocketAddress(url.href),
      `${url.pathname}ws${url.search}`,
      url.host,
      '',
      'ping\n',
    )
    expect(head).toMatch(/^HTTP\/1\.1 101 /)
    expect(head.toLowerCase()).not.toContain('service-worker-allowed')
    expect(head.toLowerCase()).not.toContain('domain=')
    expect(head).not.toContain('cairn_preview=forged')
    expect(head).toContain('cross-origin-opener-policy: same-origin-allow-popups')
    expect(head.endsWith('ping\n')).toBe(true)
  })
})

describe.skipIf(!existsSync(CHROMIUM))('a hostile preview page in chromium', () => {
  let browser: Browser

  beforeAll(async () => {
    await buildConsole()
  })

  afterAll(async () => {
    await browser?.close()
  })

  it("can neither read the console's storage nor call the API with its key", async () => {
    browser = await launchBrowser(t.url)
    const { page, context } = browser
    await page.goto(`${t.url}/`)
    await page.locator('#api-key').fill(t.key)
    await page.getByRole('button', { name: 'Sign in' }).click()
    await page.getByRole('heading', { name: 'Sessions' }).waitFor()
    // What the page is after: the console keeps the key in its sessionStorage.
    expect(JSON.stringify(await page.evaluate(() => ({ ...sessionStorage })))).toContain(t.key)

    // The user opened another preview (port 8001) before: its cookie is in the browser.
    const sibling = new URL(await signedUrl(8001))
    await page.goto(`${sibling.origin}/secret${sibling.search}`)
    expect(await page.textContent('body')).toBe('secret of port 8001')

    // The same tab follows a link to the preview, as a user would.
    const hash = new URLSearchParams({ api: t.url, sibling: sibling.origin })
    await page.goto(`${await signedUrl()}#${hash}`)
    await expect.poll(() => page.title(), { timeout: 20_000 }).toBe('done')
    const results = (await page.evaluate('window.results')) as Record<string, string>

    expect(results.origin).not.toBe(new URL(t.url).origin)
    expect(results.sessionStorage).not.toContain(t.key)
    expect(results.localStorage).not.toContain(t.key)
    expect(results.cookie).not.toContain(t.key)
    expect(results.apiWithFoundKey).toMatch(/^error: TypeError/)
    expect(results.apiWithCredentials).toMatch(/^error: TypeError/)
    expect(results.openedConsole).toMatch(/^error: SecurityError/)
    expect(results.serviceWorkerForRoot).toMatch(/^error: SecurityError.*max scope/)
    // Service workers work on the preview's own origin; the refusal above is the scope.
    expect(results.serviceWorkerForItsDirectory).toBe('registered')
    // Nor does it read another preview with that preview's cookie, however permissive its CORS.
    expect(results.siblingWithItsCookie).not.toContain('secret of port 8001')

    // The preview's cookies stayed on its host: not on another preview's (port 8001), nor on the console's.
    const own = new URL(page.url()).origin
    expect((await context.cookies(own)).map((c) => c.name).sort()).toEqual([
      'cairn_preview',
      'planted',
      'tossed',
    ])
    expect((await context.cookies(sibling.origin)).map((c) => c.name)).toEqual(['cairn_preview'])
    expect(await context.cookies(previewOrigin(t.server.previewPort, sessionId, 8002))).toEqual([])
    expect((await context.cookies(own)).find((c) => c.name === 'cairn_preview')?.value).not.toBe('forged')

    // Back on the console: no worker controls it, no preview cookie reached it, the key is intact.
    await page.goto(`${t.url}/`)
    await page.getByRole('heading', { name: 'Sessions' }).waitFor()
    expect(await page.evaluate(async () => (await navigator.serviceWorker.getRegistrations()).length)).toBe(0)
    expect(await page.evaluate(() => navigator.serviceWorker.controller)).toBeNull()
    expect((await context.cookies(t.url)).map((c) => c.name)).toEqual([])
    expect(JSON.stringify(await page.evaluate(() => ({ ...sessionStorage })))).toContain(t.key)
  })
})

describe.skipIf(!existsSync(CHROMIUM))("an agent-written file in chromium's console", () => {
  let browser: Browser

  beforeAll(async () => {
    await buildConsole()
  })

  afterAll(async () => {
    await browser?.close()
  })

  // The console shows workspace images from object URLs, which are of the console's origin: an SVG
  // opened from there (the tab follows the image) would run its script next to the API key.
  it("shows images the agent wrote without ever running them on the console's origin", async () => {
    const script =
      "document.title = 'ran on ' + location.origin + ': ' + (() => { try { return JSON.stringify({ ...sessionStorage }) } catch (e) { return e.name } })()"
    const files = {
      // A real SVG, shown as an image, with a script.
      'evil.svg': `<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"><script>${script}</script><rect width="8" height="8"/></svg>`,
      // HTML named as a PNG: shown (broken) as an image/png.
      'evil.png': `<!doctype html><html><head><title>x</title></head><body><script>${script}</script></body></html>`,
    }
    for (const [name, body] of Object.entries(files)) {
      const encoded = Buffer.from(body).toString('base64')
      const wrote = await t.api.send(sessionId, `echo ${encoded} | base64 -d > /workspace/${name}`)
      expect(wrote.text).toContain('[exit 0]')
    }
    browser = await launchBrowser(t.url)
    const { page } = browser
    await page.goto(`${t.url}/`)
    await page.locator('#api-key').fill(t.key)
    await page.getByRole('button', { name: 'Sign in' }).click()
    await page.getByRole('heading', { name: 'Sessions' }).waitFor()
    for (const name of Object.keys(files)) {
      await page.goto(`${t.url}/#/sessions/${sessionId}`)
      await page.locator('nav.tabs a[data-tab="files"]').click()
      await page.locator(`#file-tree button.file[data-path="/workspace/${name}"]`).click()
      await page.locator('#file-viewer img').waitFor()
      if (name.endsWith('.svg')) {
        await page.waitForFunction(
          () => (document.querySelector('#file-viewer img') as HTMLImageElement | null)?.naturalWidth === 8,
        )
      }
      const src = (await page.locator('#file-viewer img').getAttribute('src')) ?? ''
      // The user opens the image itself, in the same tab.
      await page.goto(src)
      await new Promise((r) => setTimeout(r, 300))
      const title = await page.title()
      expect(title, name).not.toContain(t.key)
      expect(title, name).not.toContain(new URL(t.url).origin)
      await page.goto(`${t.url}/`)
    }
  })
})

/** Sends an Upgrade request on a raw socket; what came back within a few seconds. */
async function rawUpgrade(
  address: { host: string; port: number },
  path: string,
  host: string,
  extraHeaders: string,
  afterHandshake?: string,
): Promise<string> {
  const socket = net.connect(address.port, address.host)
  let received = ''
  let sent = false
  socket.on('error', () => undefined)
  socket.on('data', (chunk) => {
    received += chunk.toString()
    if (afterHandshake && !sent && received.includes('\r\n\r\n')) {
      sent = true
      socket.write(afterHandshake)
    }
  })
  socket.write(
    `GET ${path} HTTP/1.1\r\nHost: ${host}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n${extraHeaders}\r\n`,
  )
  const done = () =>
    afterHandshake
      ? received.endsWith(afterHandshake)
      : received.includes('\r\n\r\n') && !received.includes(' 101 ')
  for (let i = 0; i < 60 && !done(); i++) await new Promise((r) => setTimeout(r, 50))
  socket.destroy()
  return received
}
