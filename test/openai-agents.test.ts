import { CairnEditor, CairnShell, cairnTools } from '@cairn/openai-agents'
import { Cairn, type Session, SessionNotFoundError } from '@cairn/sdk'
import { Agent, OpenAIProvider, Runner } from '@openai/agents'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { patchCall, type ResponseItem, StandInModel, shellCall } from './helpers/responses-model.js'
import { startTestServer, type TestServer } from './helpers/server.js'

/**
 * An agent written with the OpenAI Agents SDK (`@openai/agents` itself) whose shell and
 * apply_patch tools run in a Cairn session (issue 30, item 5; docs/openai-agents.md): a real
 * server, and a stand-in for the model's API on loopback that makes the calls the test plans.
 */
let t: TestServer
let cairn: Cairn
const model = new StandInModel()
let runner: Runner

beforeAll(async () => {
  t = await startTestServer({ server: { rateLimitPerSecond: 0 } })
  expect((await t.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
  cairn = new Cairn({ baseUrl: t.url, apiKey: t.key })
  await model.start()
  runner = new Runner({
    modelProvider: new OpenAIProvider({ apiKey: 'sk-stand-in', baseURL: model.url }),
    tracingDisabled: true,
  })
})

afterAll(async () => {
  await model.close()
  await t?.close()
})

/** One run of an agent with the Cairn tools on `session`; the model answers as planned. */
async function run(session: Session, ...plan: ResponseItem[][]) {
  model.will(...plan)
  const agent = new Agent({
    name: 'coder',
    instructions: 'Work in the workspace.',
    tools: cairnTools(session),
  })
  const result = await runner.run(agent, 'go', { maxTurns: plan.length + 1 })
  expect(result.finalOutput).toBe('done')
  return model.toolOutputs()
}

const exit = (code: number | null) => ({ type: 'exit', exit_code: code })

describe('the OpenAI Agents SDK on a Cairn session', () => {
  it('runs the shell and apply_patch tools in the workspace, which persists from run to run (cold between)', async () => {
    const session = await cairn.sessions.create('shell', { keepWarmMs: 500 })
    let outputs = await run(
      session,
      [shellCall('c1', ['echo hello > notes.txt', 'cat notes.txt', 'pwd'])],
      [patchCall('p1', { type: 'update_file', path: 'notes.txt', diff: '@@\n-hello\n+hello, patched\n' })],
      [
        patchCall('p2', {
          type: 'create_file',
          path: '/workspace/src/app.txt',
          diff: '+line one\n+line two\n',
        }),
      ],
    )
    // The model offered both tools, and what it got back.
    expect(model.requests[0]?.tools.map((tool) => tool.type).sort()).toEqual(['apply_patch', 'shell'])
    expect(outputs.get('c1')?.output).toEqual([
      { stdout: '', stderr: '', outcome: exit(0) },
      { stdout: 'hello\n', stderr: '', outcome: exit(0) },
      { stdout: '/workspace\n', stderr: '', outcome: exit(0) },
    ])
    expect(outputs.get('p1')).toMatchObject({ status: 'completed', output: 'updated notes.txt' })
    expect(outputs.get('p2')).toMatchObject({ status: 'completed' })
    expect(await session.files.readText('notes.txt')).toBe('hello, patched\n')
    const snapshot = await session.snapshots.create({ label: 'after the first run' })

    // The sandbox goes cold; the next run's first command starts it again on the same workspace.
    let warm = true
    for (let i = 0; i < 100 && warm; i++) {
      await new Promise((resolve) => setTimeout(resolve, 100))
      warm = (await session.refresh()).warm
    }
    expect(warm).toBe(false)
    outputs = await run(
      session,
      [shellCall('c2', ['cat notes.txt src/app.txt'])],
      [patchCall('p3', { type: 'delete_file', path: 'notes.txt' })],
    )
    expect(outputs.get('c2')?.output).toEqual([
      // A created file's text is its `+` lines joined (the SDK's applyDiff): no newline after the last.
      { stdout: 'hello, patched\nline one\nline two', stderr: '', outcome: exit(0) },
    ])
    expect(outputs.get('p3')).toMatchObject({ status: 'completed', output: 'deleted notes.txt' })
    expect((await session.files.list()).map((entry) => entry.name)).not.toContain('notes.txt')
    // The snapshot still has the file as the first run left it.
    expect(await session.files.readText('notes.txt', { snapshot: snapshot.id })).toBe('hello, patched\n')

    // With a `cwd`, both tools take relative paths from that directory.
    const inSrc = { cwd: 'src' }
    const pwd = await new CairnShell(session, inSrc).run({ commands: ['pwd; ls'] })
    expect(pwd.output[0]?.stdout).toBe('/workspace/src\napp.txt\n')
    const created = await new CairnEditor(session, inSrc).createFile({
      type: 'create_file',
      path: 'b.txt',
      diff: '+b',
    })
    expect(created).toEqual({ status: 'completed', output: 'created b.txt' })
    expect(await session.files.readText('src/b.txt')).toBe('b')
  })

  it('tells the model about failed commands, timeouts, long output and patches that do not apply', async () => {
    const session = await cairn.sessions.create('shell')
    const outputs = await run(
      session,
      [
        shellCall('fails', ['echo out; echo err >&2; exit 3', 'echo next']),
        shellCall('slow', ['echo before; sleep 30', 'echo never'], { timeoutMs: 300 }),
        shellCall('long', ['head -c 100000 /dev/zero | tr "\\0" a; seq 1 5 >&2'], { maxOutputLength: 1000 }),
      ],
      [patchCall('create', { type: 'create_file', path: 'edge.txt', diff: '+one\n' })],
      [
        patchCall('again', { type: 'create_file', path: 'edge.txt', diff: '+two\n' }),
        patchCall('stale', { type: 'update_file', path: 'edge.txt', diff: '@@\n-two\n+three\n' }),
        patchCall('missing', { type: 'update_file', path: 'missing.txt', diff: '@@\n-a\n+b\n' }),
        patchCall('absolute', { type: 'create_file', path: '/etc/passwd', diff: '+root::0:0::/:/bin/sh\n' }),
        patchCall('dotdot', { type: 'create_file', path: '../escape.txt', diff: '+out\n' }),
      ],
    )
    expect(outputs.get('fails')?.output).toEqual([
      { stdout: 'out\n', stderr: 'err\n', outcome: exit(3) },
      { stdout: 'next\n', stderr: '', outcome: exit(0) },
    ])
    // The timeout ends the call: the line after it is not run.
    expect(outputs.get('slow')?.output).toEqual([
      { stdout: 'before\n', stderr: '', outcome: { type: 'timeout' } },
    ])
    const long = outputs.get('long') as {
      output: { stdout: string; stderr: string }[]
      max_output_length: number
    }
    expect(long.max_output_length).toBe(1000)
    const [clipped] = long.output
    expect(clipped?.stderr).toBe('1\n2\n3\n4\n5\n')
    // stdout gets the rest of the 1000 characters: its start and end around what was left out.
    expect(clipped?.stdout.length).toBeLessThanOrEqual(1000 - '1\n2\n3\n4\n5\n'.length)
    expect(clipped?.stdout.length).toBeGreaterThan(980)
    expect(clipped?.stdout).toMatch(/^a{400,}\n\[… 99\d{3} characters left out …\]\na{400,}$/)

    expect(outputs.get('create')).toMatchObject({ status: 'completed', output: 'created edge.txt' })
    expect(outputs.get('again')).toMatchObject({ status: 'failed', output: 'edge.txt already exists' })
    expect(outputs.get('stale')).toMatchObject({
      status: 'failed',
      output: expect.stringContaining('the patch does not apply to edge.txt'),
    })
    expect(outputs.get('missing')).toMatchObject({
      status: 'failed',
      output: expect.stringMatching(/^missing\.txt: .* \(not_found\)$/),
    })
    expect(outputs.get('absolute')).toMatchObject({
      status: 'failed',
      output: '/etc/passwd is outside the workspace: paths are relative to /workspace or under it',
    })
    expect(outputs.get('dotdot')).toMatchObject({
      status: 'failed',
      output: '../escape.txt: path escapes the workspace: .. (validation_failed)',
    })
    // The refused edits changed nothing.
    expect(await session.files.readText('edge.txt')).toBe('one')
    const names = (await session.files.list()).map((entry) => entry.name)
    expect(names).toContain('edge.txt')
    expect(names).not.toContain('etc')
    expect(names).not.toContain('missing.txt')
  })

  it("reaches only the key's tenant: another tenant's key does not find the session", async () => {
    const session = await cairn.sessions.create('shell')
    const b = await t.api.call('POST', '/v1/keys', { tenant: 'tenant-b', role: 'admin' })
    const other = new Cairn({ baseUrl: t.url, apiKey: b.body.key })
    const handle = { commands: other.sessions.commands(session.id), files: other.sessions.files(session.id) }
    await expect(new CairnShell(handle).run({ commands: ['true'] })).rejects.toBeInstanceOf(
      SessionNotFoundError,
    )
    await expect(
      new CairnEditor(handle).createFile({ type: 'create_file', path: 'x.txt', diff: '+x\n' }),
    ).rejects.toBeInstanceOf(SessionNotFoundError)
  })
})
