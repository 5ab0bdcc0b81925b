import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from '../helpers/projects.js'
import type { TestServer } from '../helpers/server.js'
import { startShellServer } from '../helpers/shell-server.js'

/**
 * A value that reaches a process holds no NUL (docs/security.md). The sandbox's environment is
 * handed to bwrap NUL-separated (`--args`), so a secret's value `a\0--cap-add\0ALL` ended there
 * and added an option of bwrap's own: the agent ran with every capability. Every route that
 * stores a secret refuses such a value with `validation_failed` and stores nothing.
 */
const COMPAT = '/compat'
let t: TestServer

beforeAll(async () => {
  t = await startShellServer({ server: { rateLimitPerSecond: 0, compatPrefix: COMPAT } })
})

afterAll(async () => {
  await t?.close()
})

/** Every route that stores a secret's value, as a request for `name` = `value`. */
const ROUTES = [
  (name: string, value: string) =>
    t.api.call('PUT', '/v1/agents/shell/secrets', { secrets: { [name]: value } }),
  (name: string, value: string) =>
    t.api.call('PUT', '/v1/agents/shell/secrets', { secrets: { [name]: value }, scope: 'setup' }),
  (name: string, value: string) =>
    t.api.call('PATCH', `${COMPAT}/v1/agents/shell/secrets`, { secrets: { [name]: value } }),
  // A session's own setup phase: its env and its command (a string for sh -c, or an argv).
  (name: string, value: string) =>
    t.api.call('POST', '/v1/sessions', {
      agent: 'shell',
      setup: { command: ['true'], env: { [name]: value } },
    }),
  (_name: string, value: string) =>
    t.api.call('POST', '/v1/sessions', { agent: 'shell', setup: { command: value } }),
  (_name: string, value: string) =>
    t.api.call('POST', '/v1/sessions', { agent: 'shell', setup: { command: ['sh', '-c', value] } }),
]

const names = async () =>
  ((await t.api.call('GET', '/v1/agents/shell/secrets')).body.data as { name: string }[]).map((s) => s.name)

describe('NUL in a value that reaches a process', () => {
  it('every route that stores a secret or a setup phase refuses a value holding a NUL anywhere, and stores nothing', async () => {
    const withNul = fc
      .tuple(
        fc.string({ maxLength: 12 }),
        fc.constantFrom('--cap-add', 'ALL', '', '--bind'),
        fc.string({ maxLength: 12 }),
      )
      .map(([a, option, b]) => `${a}\0${option}\0${b}`)
    await fc.assert(
      fc.asyncProperty(fc.nat(ROUTES.length - 1), withNul, async (route, value) => {
        const res = await ROUTES[route]?.('CAIRN_NUL', value)
        expect(res?.status, JSON.stringify(value)).toBe(400)
        expect(res?.body.error?.code ?? res?.body.code).toBe('validation_failed')
      }),
      { numRuns: 30 },
    )
    expect(await names()).not.toContain('CAIRN_NUL')
    // cairn.yaml's setup phase, the same: refused at deploy.
    const project = await makeProject({
      'cairn.yaml': `name: nul-setup\ncommand: bash agent.sh\nsession:\n  setup:\n    command: "true"\n    env: { A: "x\\0--cap-add\\0ALL" }\n`,
      'agent.sh': 'cat\n',
    })
    const deployed = await t.api.deploy(project)
    expect(deployed.status, JSON.stringify(deployed.body)).toBe(400)
  })

  it('a secret meant to add --cap-add ALL leaves the agent without capabilities', async () => {
    expect((await ROUTES[0]?.('CAIRN_CAPS', 'a\0--cap-add\0ALL'))?.status).toBe(400)
    const session = await t.api.createSession('shell')
    const run = await t.api.send(session.id, 'grep CapEff /proc/self/status')
    expect(run.terminal?.type, JSON.stringify(run.events)).toBe('run.completed')
    expect(run.text).toMatch(/CapEff:\s+0000000000000000/)
  })
})
