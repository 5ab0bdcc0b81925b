import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from './helpers/projects.js'
import { startTestServer, type TestServer } from './helpers/server.js'

let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
  const hog = await makeProject({
    'cairn.yaml': 'name: hog\ncommand: python3 hog.py\nlimits:\n  memoryMiB: 64\n  pids: 32\n',
    'hog.py': [
      'import os, time',
      'while True:',
      '    line = input()',
      '    if line == "eat":',
      '        blocks = []',
      '        while True:',
      '            blocks.append(bytearray(8 * 1024 * 1024))',
      '    elif line == "fork":',
      '        children = []',
      '        for _ in range(200):',
      '            pid = os.fork()',
      '            if pid == 0:',
      '                time.sleep(60)',
      '                os._exit(0)',
      '            children.append(pid)',
      '        print("forked", len(children))',
      '    else:',
      '        open("state.txt", "a").write(line + "\\n")',
      '        print("ok", open("state.txt").read().split())',
    ].join('\n'),
  })
  expect((await t.api.deploy(hog)).status).toBe(201)
})

afterAll(async () => {
  await t?.close()
})

describe('limits stop the agent, the session fails with the cause and stays resumable', () => {
  it('memory', async () => {
    const session = await t.api.createSession('hog')
    expect((await t.api.send(session.id, 'first')).text).toBe("ok ['first']\n")
    const run = await t.api.send(session.id, 'eat')
    expect(run.terminal?.type).toBe('run.failed')
    expect((run.terminal as { error: { code: string } }).error.code).toBe('limit_exceeded')
    const info = await t.api.call('GET', `/v1/sessions/${session.id}`)
    expect(info.body).toMatchObject({ status: 'failed', statusCause: 'memory_limit', warm: false })
    await t.api.call('POST', `/v1/sessions/${session.id}/resume`)
    expect((await t.api.send(session.id, 'second')).text).toBe("ok ['first', 'second']\n")
  })

  it('pids', async () => {
    const session = await t.api.createSession('hog')
    const run = await t.api.send(session.id, 'fork')
    expect(run.terminal?.type).toBe('run.failed')
    const info = await t.api.call('GET', `/v1/sessions/${session.id}`)
    expect(info.body).toMatchObject({ status: 'failed', statusCause: 'pids_limit', warm: false })
    expect((await t.api.send(session.id, 'after')).text).toBe("ok ['after']\n")
  })
})

describe('an agent that floods stdout', () => {
  it('is stopped at the output cap with a typed error and the session stays resumable', async () => {
    const flood = await makeProject({
      'cairn.yaml': 'name: flood\ncommand: python3 flood.py\n',
      'flood.py': [
        'import sys',
        'while True:',
        '    line = input()',
        '    if line == "flood":',
        '        chunk = "x" * 65536',
        '        while True:',
        '            sys.stdout.write(chunk)',
        '    print("calm " + line)',
      ].join('\n'),
    })
    expect((await t.api.deploy(flood)).status).toBe(201)
    const session = await t.api.createSession('flood')
    const run = await t.api.send(session.id, 'flood')
    expect(run.terminal?.type).toBe('run.failed')
    expect((run.terminal as { error: { code: string; message: string } }).error.message).toContain(
      'more than',
    )
    const info = await t.api.call('GET', `/v1/sessions/${session.id}`)
    expect(info.body).toMatchObject({ status: 'failed', statusCause: 'output_limit' })
    expect((await t.api.send(session.id, 'after')).text).toBe('calm after\n')
  })
})
