import { afterAll, describe, expect, it } from 'vitest'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

// An agent that exits mid-turn is covered by test/bad-input.test.ts (agent_crashed, resumable) and
// one that floods stdout by test/limits.test.ts (output cap); this file covers the silent one.
let t: TestServer | undefined

afterAll(async () => {
  await t?.close()
})

describe('an agent that never answers', () => {
  it('is stopped at the turn timeout with a typed timeout error, and the session resumes intact', async () => {
    t = await startTestServer()
    const project = await makeProject({
      'cairn.yaml': 'name: sleeper\ncommand: python3 sleeper.py\nlimits:\n  turnTimeoutMs: 1000\n',
      'sleeper.py': [
        'import time',
        'while True:',
        '    line = input()',
        '    open("log.txt", "a").write(line + "\\n")',
        '    if line == "hang":',
        '        time.sleep(3600)',
        '    print("kept", " ".join(open("log.txt").read().split()))',
      ].join('\n'),
    })
    expect((await t.api.deploy(project)).status).toBe(201)
    const session = await t.api.createSession('sleeper')
    expect((await t.api.send(session.id, 'one')).text).toBe('kept one\n')

    const hung = await t.api.send(session.id, 'hang')
    expect(hung.terminal?.type).toBe('run.failed')
    expect((hung.terminal as { error: { code: string } }).error.code).toBe('timeout')
    expect((await t.api.call('GET', `/v1/sessions/${session.id}`)).body).toMatchObject({
      status: 'failed',
      statusCause: 'turn_timeout',
      warm: false,
    })
    const turns = (await t.api.call('GET', `/v1/sessions/${session.id}/turns`)).body.data
    expect(turns[1]).toMatchObject({ status: 'failed', prompt: 'hang' })

    expect((await t.api.call('POST', `/v1/sessions/${session.id}/resume`)).body.status).toBe('idle')
    // A fresh sandbox on the same workspace: what the hung turn wrote before it hung is kept.
    expect((await t.api.send(session.id, 'two')).text).toBe('kept one hang two\n')
  })
})
