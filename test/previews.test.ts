import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { Cairn } from '@cairn/sdk'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { probeGvisor } from '../packages/runtime/src/sandbox/gvisor-driver.js'
import { assertBuilt, spawnCli } from './helpers/cli.js'
import { previewFetch, previewOrigin, rawPreviewUpgrade, UPGRADE_ECHO_PY } from './helpers/preview.js'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { Api, startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer
let sessionId = ''
const gvisor = await probeGvisor()

const waitFor = (port: number) =>
  `for i in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1', ${port}))" 2>/dev/null && break; sleep 0.05; done`

beforeAll(async () => {
  t = await startTestServer()
  const shell = await makeProject({
    ...SHELL_PROJECT,
    'upgrade_echo.py': UPGRADE_ECHO_PY,
  })
  expect((await t.api.deploy(shell)).status).toBe(201)
  sessionId = (await t.api.createSession('shell')).id
  const started = await t.api.send(
    sessionId,
    `mkdir -p site && echo "hello from the sandbox" > site/hello.txt && (nohup python3 -m http.server 8000 --bind 127.0.0.1 --directory site >/tmp/http.log 2>&1 &) && (nohup python3 upgrade_echo.py >/tmp/echo.log 2>&1 &) && ${waitFor(8000)} && ${waitFor(8001)}`,
  )
  expect(started.text).toContain('[exit 0]')
})

afterAll(async () => {
  await t?.close()
})

const signedUrl = async (port: number, ttlMs: number) => {
  const res = await t.api.call('POST', `/v1/sessions/${sessionId}/ports/${port}/url`, { ttlMs })
  expect(res.status).toBe(200)
  return res.body as { url: string; expiresAt: string }
}
/** The signed URL with a path inside the preview instead of its root. */
const at = (url: string, file: string) => url.replace('/?', `/${file}?`)
/** The origin of a session port's previews: its own host on the preview listener. */
const originOf = (id: string, port: number) => previewOrigin(t.server.previewPort, id, port)
/** A request to a preview with the API key, as `Api.call` answers it. */
const withKey = async (id: string, port: number, file: string, method = 'GET', body?: unknown) => {
  const res = await previewFetch(`${originOf(id, port)}/${file}`, {
    method,
    headers: { authorization: `Bearer ${t.key}`, 'content-type': 'application/json' },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  const text = await res.text()
  let json: unknown = text
  try {
    json = JSON.parse(text)
  } catch {}
  // biome-ignore lint/suspicious/noExplicitAny: test convenience
  return { status: res.status, body: json as any }
}

describe('previews of services inside a session sandbox', () => {
  it('lists the open ports in the manifest', async () => {
    const manifest = await t.api.call('GET', `/v1/sessions/${sessionId}/manifest`)
    expect(manifest.body.openPorts).toEqual(expect.arrayContaining([8000, 8001]))
  })

  it('serves a file through a signed URL, and through the cookie that URL leaves', async () => {
    const { url, expiresAt } = await signedUrl(8000, 60_000)
    expect(url.startsWith(`${originOf(sessionId, 8000)}/?`)).toBe(true)
    expect(Date.parse(expiresAt)).toBeGreaterThan(Date.now())
    const res = await previewFetch(at(url, 'hello.txt'))
    expect(res.status).toBe(200)
    expect(await res.text()).toBe('hello from the sandbox\n')
    const cookie = res.headers.get('set-cookie') ?? ''
    expect(cookie).toContain('; Path=/;')
    const again = await previewFetch(`${originOf(sessionId, 8000)}/hello.txt`, {
      headers: { cookie: cookie.split(';')[0] ?? '' },
    })
    expect(again.status).toBe(200)
    // The cookie is the preview's: another port of the session (another origin) does not take it.
    const otherOrigin = await previewFetch(`${originOf(sessionId, 8001)}/`, {
      headers: { cookie: cookie.split(';')[0] ?? '' },
    })
    expect(otherOrigin.status).toBe(403)
  })

  it("hands the SDK a URL on the preview's own origin", async () => {
    const client = new Cairn({ baseUrl: t.url, apiKey: t.key })
    const { url } = await client.sessions.previewUrl(sessionId, 8000, { ttlMs: 60_000 })
    expect(new URL(url).origin).toBe(originOf(sessionId, 8000))
    expect(await (await previewFetch(at(url, 'hello.txt'))).text()).toBe('hello from the sandbox\n')
  })

  it('prints a signed URL with `cairn sessions open`', async () => {
    assertBuilt()
    const env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: t.dataDir }
    const { done } = spawnCli(['sessions', 'open', sessionId.slice(0, 10), '8000', '--ttl', '5m'], env)
    const result = await done
    expect(result.code).toBe(0)
    const url = result.stdout.trim()
    expect(url).toContain(`${originOf(sessionId, 8000)}/?cairn_expires=`)
    expect(await (await previewFetch(at(url, 'hello.txt'))).text()).toBe('hello from the sandbox\n')
  })

  it('serves the caller with an API key', async () => {
    const res = await withKey(sessionId, 8000, 'hello.txt')
    expect(res).toEqual({ status: 200, body: 'hello from the sandbox\n' })
    // Other methods and their bodies reach the service as they are (http.server refuses POST).
    const post = await withKey(sessionId, 8000, 'form', 'POST', { a: 1 })
    expect(post.status).toBe(501)
    expect(String(post.body)).toContain('Unsupported method')
  })

  it('refuses without a key or signature (401), with a forged or expired one (403)', async () => {
    const none = await previewFetch(`${originOf(sessionId, 8000)}/hello.txt`)
    expect(none.status).toBe(401)
    expect(((await none.json()) as { error: { code: string } }).error.code).toBe('unauthorized')
    const { url } = await signedUrl(8000, 60_000)
    const forged = await previewFetch(
      at(url, 'hello.txt').replace(/cairn_signature=[^&]+/, 'cairn_signature=AAAA'),
    )
    expect(forged.status).toBe(403)
    const otherPort = await previewFetch(at(url, 'hello.txt').replace('//8000-', '//8001-'))
    expect(otherPort.status).toBe(403)
    const short = await signedUrl(8000, 1000)
    await new Promise((r) => setTimeout(r, 1100))
    const expired = await previewFetch(at(short.url, 'hello.txt'))
    expect(expired.status).toBe(403)
    expect(await expired.json()).toMatchObject({
      error: { code: 'forbidden', details: { reason: 'expired' } },
    })
  })

  it('revokes every signed URL of a port, and its cookies; URLs issued afterwards work', async () => {
    const before = await signedUrl(8000, 60_000)
    const first = await previewFetch(at(before.url, 'hello.txt'))
    expect(first.status).toBe(200)
    const cookie = (first.headers.get('set-cookie') ?? '').split(';')[0] ?? ''
    // Another port of the same session: its URL is not revoked.
    const otherPort = await signedUrl(8001, 60_000)

    const revoked = await t.api.call('DELETE', `/v1/sessions/${sessionId}/ports/8000/url`)
    expect(revoked).toEqual({ status: 200, body: { ok: true } })
    const old = await previewFetch(at(before.url, 'hello.txt'))
    expect(old.status).toBe(403)
    expect(await old.json()).toMatchObject({ error: { code: 'forbidden', details: { reason: 'revoked' } } })
    const oldCookie = await previewFetch(`${originOf(sessionId, 8000)}/hello.txt`, {
      headers: { cookie },
    })
    expect(oldCookie.status).toBe(403)
    const other = rawPreviewUpgrade(otherPort.url)
    for (let i = 0; i < 100 && !other.received().includes('saw-key'); i++)
      await new Promise((r) => setTimeout(r, 50))
    other.socket.destroy()
    expect(other.received()).toMatch(/^HTTP\/1\.1 101 /)

    const after = await signedUrl(8000, 60_000)
    expect(after.url).toContain('cairn_epoch=1')
    const fresh = await previewFetch(at(after.url, 'hello.txt'))
    expect(fresh.status).toBe(200)
    expect(await fresh.text()).toBe('hello from the sandbox\n')
    // The epoch is signed: an old URL cannot be moved into the current one.
    const moved = await previewFetch(at(`${before.url}&cairn_epoch=1`, 'hello.txt'))
    expect(moved.status).toBe(403)
    expect(await moved.json()).toMatchObject({ error: { details: { reason: 'invalid_signature' } } })

    const unknown = await t.api.call('DELETE', '/v1/sessions/ses_0000000000000000000000/ports/8000/url')
    expect(unknown.status).toBe(404)
    expect(unknown.body.error.code).toBe('session_not_found')
  })

  it('revokes with `cairn sessions revoke-urls`', async () => {
    assertBuilt()
    const { url } = await signedUrl(8000, 60_000)
    const env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: t.dataDir }
    const result = await spawnCli(['sessions', 'revoke-urls', sessionId.slice(0, 10), '8000'], env).done
    expect(result.code).toBe(0)
    expect(result.stdout).toContain('Revoked the preview URLs of port 8000')
    expect((await previewFetch(at(url, 'hello.txt'))).status).toBe(403)
  })

  it("revokes all of a session's URLs when the session ends", async () => {
    const { id } = await t.api.createSession('shell')
    const res = await t.api.call('POST', `/v1/sessions/${id}/ports/8000/url`, { ttlMs: 60_000 })
    // Accepted (no sandbox runs yet), then dead once the session ends, also after it is resumed.
    expect((await previewFetch(at(res.body.url, 'x'))).status).toBe(409)
    expect((await t.api.call('POST', `/v1/sessions/${id}/end`)).status).toBe(200)
    const ended = await previewFetch(at(res.body.url, 'x'))
    expect(ended.status).toBe(403)
    expect(await ended.json()).toMatchObject({ error: { details: { reason: 'revoked' } } })
    expect((await t.api.call('POST', `/v1/sessions/${id}/resume`)).status).toBe(200)
    expect((await previewFetch(at(res.body.url, 'x'))).status).toBe(403)
    const next = await t.api.call('POST', `/v1/sessions/${id}/ports/8000/url`, { ttlMs: 60_000 })
    expect((await previewFetch(at(next.body.url, 'x'))).status).toBe(409)
  })

  it('counts preview requests as activity', async () => {
    const before = (await t.api.call('GET', `/v1/sessions/${sessionId}`)).body.lastActiveAt as string
    await new Promise((r) => setTimeout(r, 1100))
    expect((await withKey(sessionId, 8000, 'hello.txt')).status).toBe(200)
    const after = (await t.api.call('GET', `/v1/sessions/${sessionId}`)).body.lastActiveAt as string
    expect(Date.parse(after)).toBeGreaterThan(Date.parse(before))
  })

  it('keeps the sandbox warm while previews are used, and lets it cool down afterwards', async () => {
    const { id } = await t.api.createSession('shell', { keepWarmMs: 1500 })
    await t.api.send(
      id,
      `(nohup python3 -m http.server 8002 --bind 127.0.0.1 >/dev/null 2>&1 &) && ${waitFor(8002)}`,
    )
    // Four seconds of preview traffic: more than twice the keep-warm window.
    for (let i = 0; i < 10; i++) {
      expect((await withKey(id, 8002, '')).status).toBe(200)
      await new Promise((r) => setTimeout(r, 400))
    }
    expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.warm).toBe(true)
    await new Promise((r) => setTimeout(r, 2500))
    expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.warm).toBe(false)
  })

  it('relays an HTTP Upgrade and the bytes after it, without the API key', async () => {
    const { url } = await signedUrl(8001, 60_000)
    const upgrade = rawPreviewUpgrade(url)
    for (let i = 0; i < 100 && !upgrade.received().includes('saw-key'); i++)
      await new Promise((r) => setTimeout(r, 50))
    upgrade.socket.write('ping\n')
    for (let i = 0; i < 100 && !upgrade.received().endsWith('ping\n'); i++)
      await new Promise((r) => setTimeout(r, 50))
    upgrade.socket.destroy()
    expect(upgrade.received()).toMatch(/^HTTP\/1\.1 101 /)
    expect(upgrade.received()).toContain('saw-key: no\n')
    expect(upgrade.received().endsWith('ping\n')).toBe(true)
  })

  it('closes a relayed Upgrade when the URLs of its port are revoked', async () => {
    const { url } = await signedUrl(8001, 60_000)
    const upgrade = rawPreviewUpgrade(url)
    for (let i = 0; i < 100 && !upgrade.received().includes('saw-key'); i++)
      await new Promise((r) => setTimeout(r, 50))
    expect(upgrade.received()).toMatch(/^HTTP\/1\.1 101 /)
    expect((await t.api.call('DELETE', `/v1/sessions/${sessionId}/ports/8001/url`)).status).toBe(200)
    for (let i = 0; i < 100 && !upgrade.closed(); i++) await new Promise((r) => setTimeout(r, 50))
    upgrade.socket.destroy()
    expect(upgrade.closed()).toBe(true)
  })

  it('refuses a URL for a port nothing listens on in the running sandbox, naming those that do; a cold one gets its URL and a note', async () => {
    const refused = await t.api.call('POST', `/v1/sessions/${sessionId}/ports/8999/url`, { ttlMs: 60_000 })
    expect(refused.status).toBe(409)
    expect(refused.body.error).toMatchObject({
      code: 'port_not_listening',
      details: { port: 8999, listening: expect.arrayContaining([8000, 8001]) },
    })
    assertBuilt()
    const env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: t.dataDir }
    const open = await spawnCli(['sessions', 'open', sessionId, '8999'], env).done
    expect(open.code).not.toBe(0)
    expect(open.stdout).toBe('')
    expect(open.stderr).toContain('nothing listens on port 8999')
    // No sandbox runs: the URL is issued, for once one does, and the CLI says so.
    const cold = await t.api.createSession('shell')
    const later = await spawnCli(['sessions', 'open', cold.id, '8000'], env).done
    expect(later.code).toBe(0)
    expect(later.stdout).toContain(`${originOf(cold.id, 8000)}/?cairn_expires=`)
    expect(later.stderr).toContain('no sandbox runs for this session now')
  })

  it('answers with typed errors when nothing listens or no sandbox runs', async () => {
    const closed = await withKey(sessionId, 8999, '')
    expect(closed.status).toBe(502)
    expect(closed.body.error.code).toBe('port_unreachable')
    const cold = await t.api.createSession('shell')
    const idle = await withKey(cold.id, 8000, '')
    expect(idle.status).toBe(409)
    expect(idle.body.error.code).toBe('sandbox_not_running')
  })

  it.skipIf(!gvisor.ok)('refuses previews under gVisor, which declares no ports capability', async () => {
    const project = await makeProject({
      'cairn.yaml': 'name: boxed\ncommand: bash agent.sh\nisolation: gvisor\n',
      'agent.sh': 'while IFS= read -r line; do echo "$line"; done\n',
    })
    expect((await t.api.deploy(project)).status).toBe(201)
    const { id } = await t.api.createSession('boxed')
    expect((await t.api.send(id, 'hi')).text).toBe('hi\n')
    const res = await withKey(id, 8000, '')
    expect(res.status).toBe(400)
    expect(res.body.error.details).toMatchObject({ driver: 'gvisor', capability: 'ports' })
    // No URL that would answer the same: `cairn sessions open` says why instead.
    const url = await t.api.call('POST', `/v1/sessions/${id}/ports/8000/url`, { ttlMs: 60_000 })
    expect(url.status).toBe(400)
    expect(url.body.error).toMatchObject({
      code: 'bad_request',
      details: { driver: 'gvisor', capability: 'ports' },
    })
    const env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: t.dataDir }
    const open = await spawnCli(['sessions', 'open', id, '8000'], env).done
    expect(open.code).not.toBe(0)
    expect(open.stdout).toBe('')
    expect(open.stderr).toContain('the gvisor sandbox driver cannot reach a port inside the sandbox')
  })
})

describe('preview URL revocation across a restart', () => {
  it('keeps a revoked URL revoked after the server restarts', async () => {
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-previews-'))
    const first = await startTestServer({ dataDir })
    let firstOpen = true
    let second: TestServer | undefined
    try {
      expect((await first.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
      const { id } = await first.api.createSession('shell')
      const issue = async (api: Api) =>
        (await api.call('POST', `/v1/sessions/${id}/ports/8000/url`, { ttlMs: 600_000 })).body.url as string
      const revokedUrl = await issue(first.api)
      expect((await first.api.call('DELETE', `/v1/sessions/${id}/ports/8000/url`)).status).toBe(200)
      const issuedAfter = await issue(first.api)
      await first.close()
      firstOpen = false

      second = await startTestServer({ dataDir })
      const api = new Api(second.url, first.key)
      const moved = (url: string) =>
        url.replace(`.localhost:${first.server.previewPort}/`, `.localhost:${second?.server.previewPort}/`)
      // Signatures are checked before the sandbox is looked for: 409 means the URL was accepted.
      const res = await previewFetch(moved(revokedUrl))
      expect(res.status).toBe(403)
      expect(await res.json()).toMatchObject({ error: { details: { reason: 'revoked' } } })
      expect((await previewFetch(moved(issuedAfter))).status).toBe(409)
      expect((await previewFetch(await issue(api))).status).toBe(409)
    } finally {
      if (firstOpen) await first.close()
      await second?.close()
      await rm(dataDir, { recursive: true, force: true })
    }
  })
})
