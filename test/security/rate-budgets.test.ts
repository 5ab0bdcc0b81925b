import { describe, expect, it } from 'vitest'
import WebSocket from 'ws'
import { TheirClient } from '../helpers/compat-client.js'
import { makeProject, SHELL_PROJECT } from '../helpers/projects.js'
import { startTestServer } from '../helpers/server.js'

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
})
