import path from 'node:path'
import { afterAll, beforeAll, expect } from 'vitest'
import { Api, startTestServer, type TestServer } from './server.js'

/** The agent of the protocol tests (A2A, AG-UI): its tools write and read files of its workspace. */
export const FILE_TOOLS_AGENT = path.join(import.meta.dirname, '../fixtures/file-tools')

/**
 * A server with the file-tools agent deployed for the admin key's tenant and, under the same
 * name, for tenant B (`other`): each tenant's endpoint of that name is its own.
 */
export async function startProtocolServer(): Promise<{ t: TestServer; other: Api }> {
  const t = await startTestServer({ server: { rateLimitPerSecond: 0 } })
  expect((await t.api.deploy(FILE_TOOLS_AGENT)).status).toBe(201)
  const b = await t.api.call('POST', '/v1/keys', { tenant: 'tenant-b', role: 'admin' })
  const other = new Api(t.url, b.body.key)
  expect((await other.deploy(FILE_TOOLS_AGENT)).status).toBe(201)
  return { t, other }
}

/** The protocol server of a test file: started before its tests, closed after them. */
export function useProtocolServer(): { t: TestServer; other: Api } {
  const env = {} as { t: TestServer; other: Api }
  beforeAll(async () => {
    Object.assign(env, await startProtocolServer())
  })
  afterAll(async () => {
    await env.t?.close()
  })
  return env
}
