import { connect, type Socket } from 'node:net'
import { describe, expect, it } from 'vitest'
import WebSocket from 'ws'
import { TheirClient } from '../helpers/compat-client.js'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { Api, startTestServer } from '../helpers/server.js'

/**
 * One rate budget per key and one per tenant (all its keys together), drawn on by every way in:
 * the /v1 routes, the compatibility API (docs/compat.md) and terminal upgrades (docs/commands.md).
 * Each case starts a server with small budgets of its own (a few seconds).
 */
const PREFIX = '/superserve'
describe('rate budgets across the ways in', () => {
  it('draws on the same per-key rate budget as /v1 (429 with detail once it is spent through either)', async () => {
    const limited = await startTestServer({ server: { compatPrefix: PREFIX, rateLimitPerSecond: 1 } })
    try {
      // A burst of twice the rate per second, spent through Cairn's own API.
      for (let i = 0; i < 2; i++) expect((await limited.api.call('GET', '/v1/agents')).status).toBe(200)
      const answer = await new TheirClient(`${limited.url}${PREFIX}`, limited.key).call('GET', '/agents')
      expect(answer.status).toBe(429)
      expect(answer.json.detail).toMatch(/too many requests/)
    } finally {
      await limited.close()
    }
  })

  it("draws on the tenant's budget too, all its keys together, as do terminal upgrades (429 once it is spent)", async () => {
    // The compat API took from the key's budget only, and a terminal upgrade from neither: a
    // tenant's many keys went past its rate through them.
    const limited = await startTestServer({
      server: {
        compatPrefix: PREFIX,
        rateLimitPerSecond: 100,
        operatorLimits: { tenantRateLimitPerSecond: 1 },
      },
    })
    try {
      const keys: string[] = []
      // Two keys (the admin's tenant has the same small budget: two requests at once).
      for (let i = 0; i < 2; i++)
        keys.push(
          (await limited.api.call('POST', '/v1/keys', { tenant: 'many-keys', role: 'admin' })).body.key,
        )
      // The tenant's burst (twice its rate) through both keys, then either key is refused.
      for (const key of keys)
        expect((await new TheirClient(`${limited.url}${PREFIX}`, key).call('GET', '/agents')).status).toBe(
          200,
        )
      const over = await new TheirClient(`${limited.url}${PREFIX}`, keys[0] ?? '').call('GET', '/agents')
      expect(over.status).toBe(429)
      expect(over.json.detail).toMatch(/too many requests for this tenant/)
      const upgrade = await new Promise<number>((resolve) => {
        const path = '/v1/sessions/ses_x/commands/cmd_x/terminal'
        const ws = new WebSocket(`${limited.url.replace(/^http/, 'ws')}${path}`, {
          headers: { authorization: `Bearer ${keys[1]}` },
        })
        ws.once('unexpected-response', (_request, response) => resolve(response.statusCode ?? 0))
        ws.once('open', () => resolve(101))
        ws.once('error', () => resolve(0))
      })
      expect(upgrade).toBe(429)
    } finally {
      await limited.close()
    }
  })

  it("takes a terminal socket's messages from the key's budget, as the stdin route's requests (waiting, not dropped, past it)", async () => {
    // Once upgraded, a socket's messages (each a database read, the node's write, a database
    // write, as a POST …/stdin) drew on no budget: one socket sent past the key's rate for ever.
    const limited = await startTestServer({ server: { rateLimitPerSecond: 10 } })
    try {
      const { api } = limited
      expect((await api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
      const { id } = await api.createSession('shell')
      const started = await api.call('POST', `/v1/sessions/${id}/commands`, { command: ['cat'], stdin: true })
      expect(started.status, JSON.stringify(started.body)).toBe(201)
      const path = `/v1/sessions/${id}/commands/${started.body.id}/terminal`
      const ws = new WebSocket(`${limited.url.replace(/^http/, 'ws')}${path}`, {
        headers: { authorization: `Bearer ${limited.key}` },
      })
      let echoed = ''
      const answered = new Promise<string>((resolve) =>
        ws.on('message', (data, binary) => {
          if (binary) echoed += data.toString()
          else if (data.toString().includes('budget-probe')) resolve(data.toString())
        }),
      )
      await new Promise((resolve) => ws.once('open', resolve))
      // Twice the burst (20) in messages; the answer to the last comes after every one before it.
      for (let i = 0; i < 40; i++) ws.send(Buffer.from(`${i % 10}`), { binary: true })
      ws.send('budget-probe')
      await answered
      // The budget is spent: the key's next requests are refused until it refills.
      const statuses = []
      for (let i = 0; i < 5; i++) statuses.push((await api.call('GET', '/v1/agents')).status)
      expect(
        statuses.filter((status) => status === 429).length,
        JSON.stringify(statuses),
      ).toBeGreaterThanOrEqual(3)
      // Every message reached the command (none was dropped for the budget): `cat` gives them all back.
      for (let i = 0; i < 200 && echoed.length < 40; i++)
        await new Promise((resolve) => setTimeout(resolve, 50))
      expect(echoed).toBe('0123456789'.repeat(4))
      ws.terminate()
    } finally {
      await limited.close()
    }
  })

  it('holds the bodies being read to a budget per tenant and one in all, refused before they are read and given back when their client leaves', async () => {
    // A body is read whole before its handler runs: a tenant's ten 100 MiB uploads at once held
    // 1.8 GiB of the server's memory, as many as it opened connections.
    const MIB = 1024 * 1024
    const limited = await startTestServer({
      server: {
        compatPrefix: PREFIX,
        maxUploadBytes: MIB,
        maxBodyBytesPerTenant: 3 * MIB,
        maxBodyBytes: 4 * MIB,
      },
    })
    const held: Socket[] = []
    let terminal: WebSocket | undefined
    try {
      const other = (await limited.api.call('POST', '/v1/keys', { tenant: 'bodies-b', role: 'admin' })).body
        .key
      // Each key used once first: a key's first check reads the database, so a later request could
      // pass an earlier one of the same key to the budget.
      expect((await new Api(limited.url, other).call('GET', '/v1/agents')).status).toBe(200)
      expect((await limited.api.call('GET', '/v1/agents')).status).toBe(200)
      const upload = '/v1/sessions/ses_00000000000000000000/files/content?path=x'
      // Three bodies of 1 MiB begun and left unfinished: the tenant's whole share.
      for (let i = 0; i < 3; i++) held.push(beginBody(limited.url, limited.key, 'PUT', upload, MIB).socket)
      // The next is refused before its body is read: a declared one, a chunked one, a compat deploy.
      expect(await refusedWithin(() => beginBody(limited.url, limited.key, 'PUT', upload, MIB))).toBe('429')
      expect(await refusedWithin(() => beginBody(limited.url, limited.key, 'PUT', upload, 'chunked'))).toBe(
        '429',
      )
      const deploy = `${PREFIX}/v1/agents`
      expect(
        await refusedWithin(() => beginBody(limited.url, limited.key, 'POST', deploy, 'multipart')),
      ).toBe('429')
      // Another tenant has a share of its own, up to the server's total (4 MiB), then 503.
      held.push(beginBody(limited.url, other, 'PUT', upload, MIB).socket)
      expect(await refusedWithin(() => beginBody(limited.url, other, 'PUT', upload, MIB))).toBe('503')
      // The clients leave: their bytes are given back, and a whole upload is read and answered.
      for (const socket of held.splice(0)) socket.destroy()
      expect(await wholeUpload(limited.url, limited.key, upload)).toBe('404')
      // A terminal socket's input its command has not taken counts in the same share: a command
      // that reads nothing, sent 4 MiB, leaves the tenant no room (each socket held 4 MiB of its own).
      expect((await limited.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
      const { id } = await limited.api.createSession('shell')
      const command = await limited.api.call('POST', `/v1/sessions/${id}/commands`, {
        command: ['sleep', '600'],
        stdin: true,
      })
      expect(command.status, JSON.stringify(command.body)).toBe(201)
      const path = `/v1/sessions/${id}/commands/${command.body.id}/terminal`
      terminal = new WebSocket(`${limited.url.replace(/^http/, 'ws')}${path}`, {
        headers: { authorization: `Bearer ${limited.key}` },
      })
      terminal.on('error', () => undefined)
      await new Promise((resolve) => terminal?.once('open', resolve))
      for (let i = 0; i < 4; i++) terminal.send(Buffer.alloc(MIB - 64), { binary: true })
      expect(await refusedWithin(() => beginBody(limited.url, limited.key, 'PUT', upload, MIB))).toBe('429')
      // The command ends: the input it never took is given back.
      const killed = await limited.api.call('POST', `/v1/sessions/${id}/commands/${command.body.id}/signal`, {
        signal: 'SIGKILL',
      })
      expect(killed.status, JSON.stringify(killed.body)).toBe(200)
      expect(await wholeUpload(limited.url, limited.key, upload)).toBe('404')
      // Two turns' streams whose clients leave once their bodies (1.5 MiB each) were read give
      // them back: a streamed answer closed by its client ran no onResponse, and kept them for good.
      for (let i = 0; i < 2; i++) {
        const other = (await limited.api.createSession('shell')).id
        await dropStreamAfterStart(limited.url, limited.key, other, 'sleep 30', 1.5 * MIB)
      }
      expect(await wholeUpload(limited.url, limited.key, upload)).toBe('404')
    } finally {
      terminal?.terminate()
      for (const socket of held) socket.destroy()
      await limited.close()
    }
  })
})

/**
 * A request whose headers and first byte are sent, the rest of its body never: its socket, and
 * the status it is answered ('none' when nothing came within 3 s: the server waits for the body).
 * `length`: a declared Content-Length, a chunked body, or a chunked multipart form.
 */
function beginBody(
  base: string,
  key: string,
  method: string,
  path: string,
  length: number | 'chunked' | 'multipart',
): { socket: Socket; answer: Promise<string> } {
  const { hostname, port } = new URL(base)
  const socket = connect(Number(port), hostname)
  socket.on('error', () => undefined)
  const framing =
    typeof length === 'number'
      ? `Content-Type: application/octet-stream\r\nContent-Length: ${length}`
      : `Content-Type: ${length === 'multipart' ? 'multipart/form-data; boundary=b' : 'application/octet-stream'}\r\nTransfer-Encoding: chunked`
  socket.write(
    `${method} ${path} HTTP/1.1\r\nHost: cairn.test\r\nAuthorization: Bearer ${key}\r\n${framing}\r\n\r\n`,
  )
  socket.write(typeof length === 'number' ? 'x' : '1\r\nx\r\n')
  const answer = new Promise<string>((resolve) => {
    let text = ''
    const timer = setTimeout(() => resolve('none'), 3000)
    socket.on('data', (chunk) => {
      text += chunk.toString('latin1')
      if (!text.includes('\r\n')) return
      clearTimeout(timer)
      resolve(text.split(' ')[1] ?? text)
    })
    socket.on('close', () => resolve(text.split(' ')[1] ?? 'closed'))
  })
  return { socket, answer }
}

/** The first refusal (4xx/5xx) of up to 5 tries of `begin` (the held bodies' headers may be read after a try's). */
async function refusedWithin(begin: () => { socket: Socket; answer: Promise<string> }): Promise<string> {
  let status = 'none'
  for (let i = 0; i < 5; i++) {
    const body = begin()
    status = await body.answer
    body.socket.destroy()
    if (/^[45]/.test(status)) return status
  }
  return status
}

/** The status a whole 1 MiB upload is answered, tried until the budget lets it in (up to 5 s). */
async function wholeUpload(base: string, key: string, path: string): Promise<string> {
  let status = ''
  for (let i = 0; i < 50 && status !== '404'; i++) {
    const body = beginBody(base, key, 'PUT', path, 1024 * 1024)
    body.socket.write(Buffer.alloc(1024 * 1024 - 1))
    status = await body.answer
    body.socket.destroy()
    if (status !== '404') await new Promise((resolve) => setTimeout(resolve, 100))
  }
  return status
}

/**
 * Sends `prompt` to `sessionId` in a body padded with JSON whitespace to `bodyBytes`, reads its
 * stream until the turn started, and leaves.
 */
async function dropStreamAfterStart(
  base: string,
  key: string,
  sessionId: string,
  prompt: string,
  bodyBytes: number,
): Promise<void> {
  const json = JSON.stringify({ prompt })
  const body = json + ' '.repeat(bodyBytes - json.length)
  const controller = new AbortController()
  const response = await fetch(`${base}/v1/sessions/${sessionId}/messages`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body,
    signal: controller.signal,
  })
  expect(response.status).toBe(200)
  const reader = response.body?.getReader()
  let text = ''
  while (reader && !text.includes('run.started')) {
    const { value, done } = await reader.read()
    if (done) break
    text += new TextDecoder().decode(value)
  }
  expect(text).toContain('run.started')
  controller.abort()
}
