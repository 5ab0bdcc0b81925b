import { describe, expect, it } from 'vitest'
import WebSocket from 'ws'
import { TheirClient } from '../helpers/compat-client.js'
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
})
