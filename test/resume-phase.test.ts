import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_AGENT } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

// `session.resume` (cairn.yaml): maintenance before a cold start on an existing workspace.
let t: TestServer

const agent = (name: string, resume: string) =>
  makeProject({
    'cairn.yaml': `name: ${name}\ncommand: bash agent.sh\nsession:\n  resume: ${JSON.stringify(resume)}\n`,
    'agent.sh': SHELL_AGENT,
  })

beforeAll(async () => {
  t = await startTestServer()
  for (const project of [
    await agent('tidy', 'echo "tidy ran in $PWD as $CAIRN_PHASE"; echo run >> resumes.log'),
    await agent('picky', 'test -f ready || { echo "not ready yet"; exit 7; }; echo ready'),
  ])
    expect((await t.api.deploy(project)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

/** How many times the resume command ran in this workspace, as the agent sees it. */
const COUNT = 'echo "runs=$(cat resumes.log 2>/dev/null | wc -l)"'

/** Stops the session's warm sandbox: its next turn starts a cold one on the same workspace. */
const coolDown = (id: string) => t.server.sessions.stopSandbox(id)

describe('maintenance on resume (session.resume)', () => {
  it('runs before the agent on a cold start on an existing workspace, never on a new or warm one, and keeps its log', async () => {
    const { id } = await t.api.createSession('tidy')
    expect((await t.api.send(id, COUNT)).text).toContain('runs=0\n')
    // Warm: nothing runs.
    expect((await t.api.send(id, COUNT)).text).toContain('runs=0\n')
    expect((await t.api.call('GET', `/v1/sessions/${id}/resume-phase`)).status).toBe(404)

    await coolDown(id)
    // The command ran before this turn's agent: the agent already sees what it wrote.
    expect((await t.api.send(id, COUNT)).text).toContain('runs=1\n')
    const info = (await t.api.call('GET', `/v1/sessions/${id}/resume-phase`)).body
    expect(info).toMatchObject({ status: 'succeeded', runs: 1, exitCode: 0, error: null })
    expect(info.logTail).toBe('tidy ran in /workspace as resume')
    const log = await t.api.call('GET', `/v1/sessions/${id}/resume-phase/log`)
    expect(log.body).toBe('tidy ran in /workspace as resume\n')

    await coolDown(id)
    expect((await t.api.send(id, COUNT)).text).toContain('runs=2\n')
    expect((await t.api.call('GET', `/v1/sessions/${id}/resume-phase`)).body.runs).toBe(2)
  })

  it('a failing command fails the turn with resume_failed and leaves the session resumable; the next message runs it again', async () => {
    const { id } = await t.api.createSession('picky')
    expect((await t.api.send(id, 'echo first')).text).toContain('first')
    await coolDown(id)
    const failed = await t.api.send(id, 'echo second')
    expect(failed.terminal).toMatchObject({ type: 'run.failed', error: { code: 'resume_failed' } })
    expect(failed.text).toBe('')
    expect((await t.api.call('GET', `/v1/sessions/${id}`)).body).toMatchObject({
      status: 'failed',
      statusCause: 'resume_failed',
    })
    const info = (await t.api.call('GET', `/v1/sessions/${id}/resume-phase`)).body
    expect(info).toMatchObject({ status: 'failed', runs: 1, exitCode: 7 })
    expect(info.logTail).toBe('not ready yet')

    // What the command waits for is put there; the next message resumes the session and runs it again.
    const put = await t.api.call('PUT', `/v1/sessions/${id}/files/content?path=ready`, 'x', {
      'content-type': 'application/octet-stream',
    })
    expect(put.status).toBe(200)
    expect((await t.api.send(id, 'echo third')).text).toContain('third')
    expect((await t.api.call('GET', `/v1/sessions/${id}`)).body.status).toBe('idle')
    expect((await t.api.call('GET', `/v1/sessions/${id}/resume-phase`)).body).toMatchObject({
      status: 'succeeded',
      runs: 2,
      logTail: 'ready',
    })
  })
})
