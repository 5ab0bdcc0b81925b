import { existsSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { spawnCli } from './helpers/cli.js'
import { makeProject } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer
let configDir: string

beforeAll(async () => {
  t = await startTestServer()
  configDir = await mkdtemp(path.join(os.tmpdir(), 'cairn-policy-cli-'))
  const project = await makeProject({
    'cairn.yaml': 'name: keeper\ncommand: python3 keeper.py\n',
    'keeper.py': [
      'while True:',
      '    line = input()',
      '    open("log.txt", "a").write(line + "\\n")',
      '    print("kept", len(open("log.txt").read().split()))',
    ].join('\n'),
  })
  expect((await t.api.deploy(project)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
  await rm(configDir, { recursive: true, force: true })
})

const get = async (id: string) => (await t.api.call('GET', `/v1/sessions/${id}`)).body
const causes = async (id: string) =>
  (await t.api.call('GET', `/v1/sessions/${id}/events`)).body.data.map(
    (e: { to: string; cause: string }) => `${e.to}:${e.cause}`,
  )

describe('the lifecycle policy', () => {
  it('is stored with the session, shown by the API and the CLI, inherited by a fork and changed by resume and restore', async () => {
    const plain = await t.api.createSession('keeper')
    expect((await get(plain.id)).policy).toEqual({
      idleTimeoutMs: 30 * 24 * 3600 * 1000,
      keepWarmMs: 300_000,
      maxTurns: null,
      maxDurationMs: null,
      onTimeout: 'keep',
      approvalTimeoutMs: null,
    })

    const session = await t.api.createSession('keeper', {
      idleTimeoutMs: 600_000,
      policy: { maxTurns: 5, maxDurationMs: 3_600_000, onTimeout: 'destroy', keepWarmMs: 0 },
    })
    const info = await get(session.id)
    expect(info.policy).toEqual({
      idleTimeoutMs: 600_000,
      keepWarmMs: 0,
      maxTurns: 5,
      maxDurationMs: 3_600_000,
      onTimeout: 'destroy',
      approvalTimeoutMs: null,
    })
    expect(info).toMatchObject({ idleTimeoutMs: 600_000, keepWarmMs: 0 })
    expect(Date.parse(info.deadlineAt)).toBeGreaterThan(Date.now() + 3_500_000)

    const cli = await spawnCli(['sessions', 'get', session.id], {
      CAIRN_API_URL: t.url,
      CAIRN_API_KEY: t.key,
      CAIRN_CONFIG_DIR: configDir,
    }).done
    expect(cli.code).toBe(0)
    expect(cli.stdout).toMatch(/Max turns:\s+5 \(0 used\)/)
    expect(cli.stdout).toMatch(/Max duration:\s+1h/)
    expect(cli.stdout).toMatch(/On timeout:\s+destroy/)

    // The same field twice with different values is refused, not silently resolved.
    const twice = await t.api.call('POST', '/v1/sessions', {
      agent: 'keeper',
      idleTimeoutMs: 60_000,
      policy: { idleTimeoutMs: 120_000 },
    })
    expect(twice.status).toBe(400)
    expect(twice.body.error.code).toBe('validation_failed')
    const unknown = await t.api.call('POST', '/v1/sessions', { agent: 'keeper', policy: { maxTurn: 3 } })
    expect(unknown.status).toBe(400)

    expect((await t.api.send(session.id, 'one')).text).toBe('kept 1\n')
    const fork = await t.api.call('POST', `/v1/sessions/${session.id}/fork`, { turn: 1 })
    expect(fork.status).toBe(201)
    expect(fork.body.policy).toEqual(info.policy)
    const overridden = await t.api.call('POST', `/v1/sessions/${session.id}/fork`, {
      turn: 1,
      policy: { maxTurns: null, onTimeout: 'keep' },
    })
    expect(overridden.body.policy).toEqual({ ...info.policy, maxTurns: null, onTimeout: 'keep' })

    await t.api.call('POST', `/v1/sessions/${session.id}/end`)
    const resumed = await t.api.call('POST', `/v1/sessions/${session.id}/resume`, {
      policy: { maxTurns: 10, maxDurationMs: null },
    })
    expect(resumed.status).toBe(200)
    expect(resumed.body.policy).toMatchObject({ maxTurns: 10, maxDurationMs: null, onTimeout: 'destroy' })
    expect(resumed.body.deadlineAt).toBeNull()

    const restored = await t.api.call('POST', `/v1/sessions/${session.id}/restore`, {
      turn: 0,
      policy: { onTimeout: 'keep' },
    })
    expect(restored.status).toBe(200)
    expect(restored.body.session.policy).toMatchObject({ maxTurns: 10, onTimeout: 'keep' })
    expect(await causes(session.id)).toContain('idle:policy_changed')
  })

  it('maxTurns: the last turn ends the session (max_turns), the next message is refused until a resume raises it', async () => {
    const session = await t.api.createSession('keeper', { policy: { maxTurns: 2 } })
    expect((await t.api.send(session.id, 'a')).text).toBe('kept 1\n')
    expect((await t.api.send(session.id, 'b')).text).toBe('kept 2\n')
    expect(await get(session.id)).toMatchObject({
      status: 'completed',
      statusCause: 'max_turns',
      warm: false,
      turnCount: 2,
    })

    const refused = await t.api.send(session.id, 'c')
    expect(refused.status).toBe(409)
    expect(refused.body).toMatchObject({
      error: { code: 'turn_limit_reached', details: { maxTurns: 2, turnCount: 2 } },
    })
    const fork = await t.api.call('POST', `/v1/sessions/${session.id}/fork`, { turn: 2 })
    expect(fork.status).toBe(409)
    expect(fork.body.error.code).toBe('turn_limit_reached')
    const stillRefused = await t.api.call('POST', `/v1/sessions/${session.id}/resume`)
    expect(stillRefused.status).toBe(409)
    expect(stillRefused.body.error.code).toBe('turn_limit_reached')
    expect((await t.api.call('GET', `/v1/sessions/${session.id}/messages`)).body.data).toHaveLength(4)

    const raised = await t.api.call('POST', `/v1/sessions/${session.id}/resume`, { policy: { maxTurns: 3 } })
    expect(raised.body).toMatchObject({ status: 'idle', policy: { maxTurns: 3 } })
    expect((await t.api.send(session.id, 'c')).text).toBe('kept 3\n')
    expect(await causes(session.id)).toEqual(
      expect.arrayContaining(['completed:max_turns', 'completed:policy_changed', 'idle:user_resume']),
    )
  })

  it('refuses a limit that is not a number or null (0, false, "") instead of taking it as no limit', async () => {
    const before = (await t.api.call('GET', '/v1/sessions?limit=500')).body.data.length
    for (const [field, value, says] of [
      ['maxTurns', 0, 'must be >= 1 or null'],
      ['maxTurns', false, 'must be integer or null'],
      ['maxTurns', '5', 'must be integer or null'],
      ['maxDurationMs', '', 'must be integer or null'],
      ['maxDurationMs', 0, 'must be >= 1000 or null'],
    ] as const) {
      const res = await t.api.call('POST', '/v1/sessions', { agent: 'keeper', policy: { [field]: value } })
      expect(res.status, `${field}: ${JSON.stringify(value)}`).toBe(400)
      expect(res.body.error).toMatchObject({
        code: 'validation_failed',
        message: `body/policy/${field} ${says}`,
      })
    }
    expect((await t.api.call('GET', '/v1/sessions?limit=500')).body.data.length).toBe(before)
    // The same on resume: the session keeps its limit.
    const session = await t.api.createSession('keeper', { policy: { maxTurns: 2 } })
    const resumed = await t.api.call('POST', `/v1/sessions/${session.id}/resume`, {
      policy: { maxTurns: false },
    })
    expect(resumed.status).toBe(400)
    expect((await get(session.id)).policy.maxTurns).toBe(2)
    // A prompt is text: `false` is not the prompt "false", and no turn runs.
    const sent = await t.api.call('POST', `/v1/sessions/${session.id}/messages`, { prompt: false })
    expect(sent.status).toBe(400)
    expect(sent.body.error.message).toBe('body/prompt must be string')
    expect((await get(session.id)).turnCount).toBe(0)
  })

  it('maxDurationMs: past it the session times out (max_duration); a resume restarts the clock', async () => {
    const session = await t.api.createSession('keeper', { policy: { maxDurationMs: 1000 } })
    expect((await t.api.send(session.id, 'early')).text).toBe('kept 1\n')
    await new Promise((r) => setTimeout(r, 1100))
    await t.server.sessions.reap()
    expect(await get(session.id)).toMatchObject({
      status: 'timeout',
      statusCause: 'max_duration',
      warm: false,
    })

    const refused = await t.api.send(session.id, 'late')
    expect(refused.status).toBe(409)
    expect(refused.body.error.code).toBe('duration_limit_reached')

    const resumed = await t.api.call('POST', `/v1/sessions/${session.id}/resume`, {
      policy: { maxDurationMs: 60_000 },
    })
    expect(resumed.body.status).toBe('idle')
    expect((await t.api.send(session.id, 'again')).text).toBe('kept 2\n')
  })

  it('onTimeout destroy: the idle timeout deletes the workspace and says why', async () => {
    const session = await t.api.createSession('keeper', {
      policy: { idleTimeoutMs: 1000, onTimeout: 'destroy' },
    })
    expect((await t.api.send(session.id, 'x')).text).toBe('kept 1\n')
    const workspace = t.server.runtime.pool.workspacePath(session.id)
    expect(existsSync(workspace)).toBe(true)
    await new Promise((r) => setTimeout(r, 1100))
    await t.server.sessions.reap()
    // The server's own deadline timer may have begun the deletion first: it finishes on its own.
    for (let i = 0; i < 100 && (await get(session.id)).status !== 'deleted'; i++)
      await new Promise((r) => setTimeout(r, 50))
    expect(await get(session.id)).toMatchObject({ status: 'deleted', statusCause: 'idle_timeout' })
    expect(existsSync(workspace)).toBe(false)
    const events = (await t.api.call('GET', `/v1/sessions/${session.id}/events`)).body.data
    expect(events.slice(-2)).toMatchObject([
      { to: 'timeout', cause: 'idle_timeout' },
      { to: 'deleted', cause: 'idle_timeout', detail: 'policy onTimeout: destroy' },
    ])
  })

  it('fires timeouts within a second of when they are due, not at the next sweep', async () => {
    // The server sweeps every 60 s (the default): only a deadline timer answers in time.
    const ended = async (id: string, what: string) => {
      const started = Date.now()
      for (;;) {
        const events = (await t.api.call('GET', `/v1/sessions/${id}/events`)).body.data as {
          to: string
          cause: string
          at: string
        }[]
        const timeout = events.find((e) => e.to === 'timeout')
        if (timeout) return { cause: timeout.cause, at: Date.parse(timeout.at) }
        if (Date.now() - started > 15_000) throw new Error(`${what} did not time out within 15 s`)
        await new Promise((r) => setTimeout(r, 100))
      }
    }
    const idle = await t.api.createSession('keeper', { policy: { idleTimeoutMs: 2000, keepWarmMs: 0 } })
    await t.api.send(idle.id, 'one')
    const lastActive = Date.parse((await get(idle.id)).lastActiveAt)
    const idleEnd = await ended(idle.id, 'the idle session')
    expect(idleEnd.cause).toBe('idle_timeout')
    expect(idleEnd.at).toBeGreaterThanOrEqual(lastActive + 2000)
    expect(idleEnd.at).toBeLessThan(lastActive + 2000 + 3000)

    // A deadline made earlier by a resume's new policy is armed at once (the timer is re-armed on change).
    const capped = await t.api.createSession('keeper', { policy: { idleTimeoutMs: 600_000 } })
    const resumedAt = Date.now()
    await t.api.call('POST', `/v1/sessions/${capped.id}/end`)
    const resumed = await t.api.call('POST', `/v1/sessions/${capped.id}/resume`, {
      policy: { maxDurationMs: 2000 },
    })
    expect(resumed.status).toBe(200)
    const deadline = Date.parse(resumed.body.deadlineAt)
    expect(deadline).toBeGreaterThanOrEqual(resumedAt + 2000)
    const cappedEnd = await ended(capped.id, 'the session past its max duration')
    expect(cappedEnd.cause).toBe('max_duration')
    expect(cappedEnd.at).toBeGreaterThanOrEqual(deadline)
    expect(cappedEnd.at).toBeLessThan(deadline + 3000)
  })
})
