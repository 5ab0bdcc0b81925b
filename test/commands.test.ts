import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { Cairn, type SseMessage } from '@cairn/sdk'
import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import WebSocket from 'ws'
import { assertBuilt, spawnCli } from './helpers/cli.js'
import { makeProject, SHELL_PROJECT } from './helpers/projects.js'
import { Api, startTestServer, type TestServer } from './helpers/server.js'
import { readEvents } from './helpers/sse.js'

/**
 * Commands in a session's sandbox outside turns (issue 30, item 1; docs/commands.md): one server
 * for the file, with the `shell` agent (each line run by bash) so turns and commands can be told
 * apart in one sandbox.
 */
let t: TestServer
let session = ''

beforeAll(async () => {
  t = await startTestServer({ server: { rateLimitPerSecond: 0 } })
  expect((await t.api.deploy(await makeProject(SHELL_PROJECT))).status).toBe(201)
  session = (await t.api.createSession('shell', { keepWarmMs: 60_000 })).id
})

afterAll(async () => {
  await t?.close()
})

const start = (id: string, body: Record<string, unknown>, api: Api = t.api) =>
  api.call('POST', `/v1/sessions/${id}/commands`, body)

/** The output stream from `offset`, read until `stop` says so or the stream ends. */
async function output(id: string, commandId: string, offset = 0, stop?: (m: SseMessage) => boolean) {
  const controller = new AbortController()
  const res = await fetch(`${t.url}/v1/sessions/${id}/commands/${commandId}/output?offset=${offset}`, {
    headers: { authorization: `Bearer ${t.key}` },
    signal: controller.signal,
  })
  expect(res.status).toBe(200)
  return readEvents(res, controller, stop)
}

/** stdout and stderr bytes of `output` events, and the `exit` event's command. */
function collect(messages: SseMessage[]) {
  const bytes = { stdout: [] as Buffer[], stderr: [] as Buffer[], all: [] as Buffer[] }
  let exit: { status: string; exitCode: number | null; signal: string | null; endCause: string } | undefined
  for (const m of messages) {
    const data = JSON.parse(m.data)
    if (m.event === 'output') {
      const chunk = Buffer.from(data.data, 'base64')
      bytes[data.stream as 'stdout' | 'stderr'].push(chunk)
      bytes.all.push(chunk)
    }
    if (m.event === 'exit') exit = data.command
  }
  return {
    stdout: Buffer.concat(bytes.stdout).toString(),
    stderr: Buffer.concat(bytes.stderr).toString(),
    all: Buffer.concat(bytes.all),
    exit,
  }
}

describe('commands in a session', () => {
  it('runs a command in the sandbox (started cold), streams its output and exit status', async () => {
    const started = await start(session, {
      command: ['sh', '-c', 'echo out; echo err >&2; pwd; id -u; exit 3'],
    })
    expect(started.status, JSON.stringify(started.body)).toBe(201)
    expect(started.body).toMatchObject({ status: 'running', cwd: '/workspace', sessionId: session })
    expect(started.body.id).toMatch(/^cmd_/)
    const read = collect((await output(session, started.body.id)).messages)
    expect(read.stdout).toBe('out\n/workspace\n1000\n')
    expect(read.stderr).toBe('err\n')
    expect(read.exit).toMatchObject({ status: 'exited', exitCode: 3, signal: null, endCause: 'exit' })
    const got = await t.api.call('GET', `/v1/sessions/${session}/commands/${started.body.id}`)
    expect(got.body).toMatchObject({ status: 'exited', exitCode: 3, outputBytes: read.all.length })
  })

  it("runs under the agent's walls: its user, cgroup, seccomp filter and no_new_privs, beside its processes", async () => {
    const probe = 'id -u; cat /proc/self/cgroup; grep -E "^(Seccomp|NoNewPrivs|CapEff):" /proc/self/status'
    const turn = await t.api.send(session, probe)
    expect(turn.text).toContain('[exit 0]')
    const started = await start(session, { command: ['sh', '-c', `${probe}; ps -eo args`] })
    const read = collect((await output(session, started.body.id)).messages)
    expect(read.exit).toMatchObject({ exitCode: 0 })
    // The same identity, cgroup and filter as the agent's own command (the turn's bash).
    expect(read.stdout.startsWith(turn.text.replace('[exit 0]\n', ''))).toBe(true)
    expect(read.stdout).toMatch(/CapEff:\s+0+\nNoNewPrivs:\s+1\nSeccomp:\s+2\n/)
    // One sandbox: the agent's process is in the command's pid namespace.
    expect(read.stdout).toContain('bash agent.sh')
  })

  it('takes stdin, closes it, and runs in a cwd under /workspace with extra env', async () => {
    expect((await t.api.send(session, 'mkdir -p sub/dir')).text).toBe('[exit 0]\n')
    const started = await start(session, {
      command: ['sh', '-c', 'pwd; echo "$GREETING"; cat'],
      stdin: true,
      cwd: 'sub/dir',
      env: { GREETING: 'hi there' },
    })
    expect(started.body).toMatchObject({ stdinOpen: true, cwd: '/workspace/sub/dir' })
    const route = `/v1/sessions/${session}/commands/${started.body.id}/stdin`
    // Without following it, output that is not there yet is 204, not an empty stream.
    let seen = ''
    await output(session, started.body.id, 0, (m) => {
      if (m.event === 'output') seen += Buffer.from(JSON.parse(m.data).data, 'base64').toString()
      return seen.endsWith('hi there\n')
    })
    const caughtUp = (await t.api.call('GET', `/v1/sessions/${session}/commands/${started.body.id}`)).body
      .outputBytes
    const unfollowed = `/v1/sessions/${session}/commands/${started.body.id}/output?follow=false&offset=${caughtUp}`
    expect((await t.api.call('GET', unfollowed)).status).toBe(204)
    expect((await t.api.call('POST', route, { text: 'line one\n' })).status).toBe(200)
    const bytes = Buffer.from([0, 1, 2, 255, 10])
    const closed = await t.api.call('POST', route, { data: bytes.toString('base64'), close: true })
    expect(closed.body).toMatchObject({ stdinOpen: false })
    const read = collect((await output(session, started.body.id)).messages)
    expect(read.exit).toMatchObject({ exitCode: 0 })
    expect(
      read.all.equals(Buffer.concat([Buffer.from('/workspace/sub/dir\nhi there\nline one\n'), bytes])),
    ).toBe(true)
    // stdin once closed, and once the command ended: a typed refusal.
    expect((await t.api.call('POST', route, { text: 'late' })).body.error.code).toBe('conflict')
    // Closing it again changes nothing and is no error (a terminal's input can end after its command).
    const again = await t.api.call('POST', route, { close: true })
    expect(again.status, JSON.stringify(again.body)).toBe(200)
    expect(again.body).toMatchObject({ stdinOpen: false, status: 'exited' })
  })

  it('signals the command and what it started; the end names the signal', async () => {
    const started = await start(session, {
      command: ['sh', '-c', 'sleep 1000 & echo started; wait'],
    })
    const id = started.body.id
    await output(session, id, 0, (m) => m.event === 'output')
    const route = `/v1/sessions/${session}/commands/${id}/signal`
    expect((await t.api.call('POST', route, { signal: 'SIGTERM' })).status).toBe(200)
    const read = collect((await output(session, id)).messages)
    expect(read.exit).toMatchObject({
      status: 'exited',
      exitCode: null,
      signal: 'SIGTERM',
      endCause: 'signal',
    })
    // The sleep it started went with it (the signal went to its process group).
    const ps = await t.api.send(session, 'ps -eo args | grep -c "^sleep 1000" || true')
    expect(ps.text).toBe('0\n[exit 0]\n')
  })

  it('kills a command at its timeout, and says so', async () => {
    const started = await start(session, { command: ['sh', '-c', 'echo begun; sleep 1000'], timeoutMs: 300 })
    const read = collect((await output(session, started.body.id)).messages)
    expect(read.stdout).toBe('begun\n')
    expect(read.exit).toMatchObject({ status: 'exited', signal: 'SIGKILL', endCause: 'timeout' })
  })

  it('reattaches by offset from a new connection after a dropped one: no byte lost or repeated', async () => {
    // Half the output, then a wait on stdin (the client drops meanwhile), then the other half.
    const script = [
      'import sys',
      'def burst(a, b):',
      '    for i in range(a, b):',
      '        s = sys.stderr if i % 7 == 0 else sys.stdout',
      '        s.buffer.write(b"line %d \\xff\\x00\\n" % i)',
      '        s.flush()',
      'burst(0, 1500)',
      'sys.stdout.write("HALF\\n"); sys.stdout.flush()',
      'sys.stdin.readline()',
      'burst(1500, 3000)',
    ].join('\n')
    const expected = { stdout: [] as Buffer[], stderr: [] as Buffer[] }
    for (let i = 0; i < 3000; i++) {
      const line = Buffer.concat([Buffer.from(`line ${i} `), Buffer.from([0xff, 0, 10])])
      expected[i % 7 === 0 ? 'stderr' : 'stdout'].push(line)
      if (i === 1499) expected.stdout.push(Buffer.from('HALF\n'))
    }
    const started = await start(session, { command: ['python3', '-c', script], stdin: true })
    const id = started.body.id
    // The first connection reads until the half-way mark, then hangs up.
    let seen = ''
    const first = await output(session, id, 0, (m) => {
      if (m.event === 'output') seen += Buffer.from(JSON.parse(m.data).data, 'base64').toString('latin1')
      return seen.includes('HALF\n')
    })
    expect(first.ended).toBe(false)
    const lastId = Number(first.messages.at(-1)?.id)
    await t.api.call('POST', `/v1/sessions/${session}/commands/${id}/stdin`, { text: '\n', close: true })
    // A new connection picks up at the last event's id.
    const second = await output(session, id, lastId)
    expect(second.ended).toBe(true)
    const messages = [...first.messages, ...second.messages]
    // Offsets run on without a hole or an overlap: each event starts where the previous ended.
    let at = 0
    for (const m of messages.filter((x) => x.event === 'output')) {
      const data = JSON.parse(m.data)
      expect(data.offset).toBe(at)
      at += Buffer.from(data.data, 'base64').length
      expect(Number(m.id)).toBe(at)
    }
    const read = collect(messages)
    expect(Buffer.from(read.stdout, 'utf8').length).toBeGreaterThan(0)
    const stdout = Buffer.concat(
      messages
        .filter((m) => m.event === 'output' && JSON.parse(m.data).stream === 'stdout')
        .map((m) => Buffer.from(JSON.parse(m.data).data, 'base64')),
    )
    const stderr = Buffer.concat(
      messages
        .filter((m) => m.event === 'output' && JSON.parse(m.data).stream === 'stderr')
        .map((m) => Buffer.from(JSON.parse(m.data).data, 'base64')),
    )
    expect(stdout.equals(Buffer.concat(expected.stdout))).toBe(true)
    expect(stderr.equals(Buffer.concat(expected.stderr))).toBe(true)
    expect(read.exit).toMatchObject({ exitCode: 0, outputBytes: at })
    // From an offset inside an event: exactly the bytes from there.
    const tail = collect((await output(session, id, at - 5)).messages)
    expect(tail.all.equals(read.all.subarray(at - 5))).toBe(true)
  })

  it('a command across a turn, a snapshot and a fork: the turn runs beside it, the fork gets the files, not the process', async () => {
    const started = await start(session, {
      command: [
        'sh',
        '-c',
        'echo one > progress.txt; echo ready; read x; echo two >> progress.txt; echo done',
      ],
      stdin: true,
    })
    const id = started.body.id
    await output(session, id, 0, (m) => m.event === 'output')
    // A turn runs beside the command (it is not refused busy), in the same sandbox.
    const turn = await t.api.send(
      session,
      'cat progress.txt; ps -eo args | grep -c "^read\\|echo two" || true',
    )
    expect(turn.status).toBe(200)
    expect(turn.text).toMatch(/^one\n/)
    const snapshot = await t.api.call('POST', `/v1/sessions/${session}/snapshots`, { label: 'mid-command' })
    expect(snapshot.status).toBe(201)
    const fork = await t.api.call('POST', `/v1/sessions/${session}/fork`, { snapshotId: snapshot.body.id })
    expect(fork.status).toBe(201)
    await t.api.call('POST', `/v1/sessions/${session}/commands/${id}/stdin`, { text: '\n', close: true })
    const read = collect((await output(session, id)).messages)
    expect(read.exit).toMatchObject({ exitCode: 0 })
    expect(read.stdout).toBe('ready\ndone\n')
    const file = (sid: string) => t.api.call('GET', `/v1/sessions/${sid}/files/content?path=progress.txt`)
    expect((await file(session)).body).toBe('one\ntwo\n')
    // The fork has the files as the snapshot froze them, and none of the parent's commands.
    expect((await file(fork.body.id)).body).toBe('one\n')
    expect((await t.api.call('GET', `/v1/sessions/${fork.body.id}/commands`)).body.data).toEqual([])
    const events = await t.api.call('GET', `/v1/sessions/${session}/events`)
    const causes = (events.body.data as { cause: string; detail: string }[]).filter((e) =>
      e.detail?.startsWith(id),
    )
    expect(causes.map((e) => e.cause)).toEqual(['command_started', 'command_ended'])
  })

  it("keeps the sandbox past keep-warm's end while a command runs, and lets it go after", async () => {
    const brief = (await t.api.createSession('shell', { keepWarmMs: 500 })).id
    expect((await t.api.send(brief, 'true')).text).toBe('[exit 0]\n')
    // The turn left a 500 ms keep-warm window; the command outlives it.
    const started = await start(brief, { command: ['sh', '-c', 'read x; echo "got $x"'], stdin: true })
    await new Promise((resolve) => setTimeout(resolve, 1500))
    expect((await t.api.call('GET', `/v1/sessions/${brief}`)).body.warm).toBe(true)
    await t.api.call('POST', `/v1/sessions/${brief}/commands/${started.body.id}/stdin`, { text: 'late\n' })
    const read = collect((await output(brief, started.body.id)).messages)
    expect(read.exit).toMatchObject({ exitCode: 0, endCause: 'exit' })
    expect(read.stdout).toBe('got late\n')
    // Its end starts the keep-warm window again: the sandbox stops once it runs out.
    let warm = true
    for (let i = 0; i < 100 && warm; i++) {
      await new Promise((resolve) => setTimeout(resolve, 100))
      warm = (await t.api.call('GET', `/v1/sessions/${brief}`)).body.warm
    }
    expect(warm).toBe(false)
  })

  it('ends running commands with the session (their cause says so) and refuses new ones until it is resumed', async () => {
    const doomed = (await t.api.createSession('shell')).id
    const started = await start(doomed, { command: ['sleep', '1000'] })
    expect(started.status).toBe(201)
    const missing = await start(doomed, { command: ['no-such-program'] })
    expect(missing.status).toBe(400)
    expect(missing.body.error).toMatchObject({
      code: 'bad_request',
      message: expect.stringContaining('No such file'),
    })
    expect((await t.api.call('POST', `/v1/sessions/${doomed}/end`)).status).toBe(200)
    const got = await t.api.call('GET', `/v1/sessions/${doomed}/commands/${started.body.id}`)
    expect(got.body).toMatchObject({ status: 'exited', endCause: 'sandbox_stopped', signal: 'SIGKILL' })
    const again = await start(doomed, { command: ['true'] })
    expect(again.status).toBe(409)
    expect(again.body.error.code).toBe('conflict')
  })
})

describe('commands: bad input gets typed errors', () => {
  const bad = async (body: unknown, code = 'validation_failed', status = 400) => {
    const res = await t.api.call('POST', `/v1/sessions/${session}/commands`, body)
    expect(res.status, JSON.stringify(body)).toBe(status)
    expect(res.body.error.code).toBe(code)
  }

  it('refuses every field of the wrong type or out of range', async () => {
    await bad({})
    await bad({ command: [] })
    await bad({ command: 'ls' })
    await bad({ command: [1] })
    await bad({ command: ['ls'], env: { 'A B': 'x' } })
    await bad({ command: ['ls'], env: { A: 1 } })
    await bad({ command: ['ls'], env: [] })
    await bad({ command: ['ls'], cwd: 7 })
    await bad({ command: ['ls'], cwd: '../..' })
    await bad({ command: ['ls'], cwd: '/etc' })
    await bad({ command: ['ls'], timeoutMs: 0 })
    await bad({ command: ['ls'], timeoutMs: 'soon' })
    await bad({ command: ['ls'], stdin: 'yes' })
    await bad({ command: ['ls'], extra: true })
    const started = await start(session, { command: ['true'] })
    const route = `/v1/sessions/${session}/commands/${started.body.id}`
    for (const body of [{ signal: 'SIGNOPE' }, { signal: 9 }, {}]) {
      const res = await t.api.call('POST', `${route}/signal`, body)
      expect(res.status).toBe(400)
    }
    for (const body of [{ data: 'not base64!' }, { text: 5 }, { close: 'yes' }]) {
      const res = await t.api.call('POST', `${route}/stdin`, body)
      expect(res.status).toBe(400)
    }
    expect((await t.api.call('GET', `${route}/output?offset=-1`)).status).toBe(400)
    // A resize of a command with no terminal was answered 200 and did nothing.
    const plain = (await start(session, { command: ['sleep', '30'] })).body.id
    const resized = await t.api.call('POST', `/v1/sessions/${session}/commands/${plain}/resize`, {
      rows: 5,
      cols: 9,
    })
    expect(resized.status, JSON.stringify(resized.body)).toBe(409)
    expect(resized.body.error.code).toBe('conflict')
    await t.api.call('POST', `/v1/sessions/${session}/commands/${plain}/signal`, { signal: 'SIGKILL' })
  })

  it('refuses a NUL anywhere in an argument or an env value with validation_failed, never a 500', async () => {
    // A process is given C strings: a NUL reached spawn() and its TypeError answered 500.
    const withNul = fc
      .tuple(fc.string({ maxLength: 20 }), fc.string({ maxLength: 20 }))
      .map(([a, b]) => `${a}\u0000${b}`)
    const bodies = fc.oneof(
      fc
        .tuple(fc.array(fc.string({ maxLength: 10 }), { maxLength: 3 }), withNul, fc.nat(3))
        .map(([args, nul, at]) => ({ command: ['true', ...args.slice(0, at), nul, ...args.slice(at)] })),
      withNul.map((value) => ({ command: ['true'], env: { CAIRN_X: value } })),
    )
    await fc.assert(
      fc.asyncProperty(bodies, async (body) => {
        const res = await start(session, body)
        expect(res.status, JSON.stringify(body)).toBe(400)
        expect(res.body.error.code).toBe('validation_failed')
      }),
      { numRuns: 25 },
    )
  })

  it("answers an unknown session, an unknown command and another tenant's session as not found", async () => {
    const missing = await t.api.call('POST', '/v1/sessions/ses_00000000000000000000/commands', {
      command: ['ls'],
    })
    expect(missing.body.error.code).toBe('session_not_found')
    const unknown = await t.api.call('GET', `/v1/sessions/${session}/commands/cmd_00000000000000000000`)
    expect(unknown.status).toBe(404)
    expect(unknown.body.error.code).toBe('command_not_found')
    const output404 = await t.api.call(
      'GET',
      `/v1/sessions/${session}/commands/cmd_00000000000000000000/output`,
    )
    expect(output404.body.error.code).toBe('command_not_found')
    const started = await start(session, { command: ['true'] })
    const key = await t.api.call('POST', '/v1/keys', { tenant: 'other-tenant', role: 'admin' })
    const other = new Api(t.url, key.body.key)
    expect((await start(session, { command: ['ls'] }, other)).body.error.code).toBe('session_not_found')
    for (const [method, route, body] of [
      ['GET', `/v1/sessions/${session}/commands`, undefined],
      ['GET', `/v1/sessions/${session}/commands/${started.body.id}`, undefined],
      ['GET', `/v1/sessions/${session}/commands/${started.body.id}/output`, undefined],
      ['POST', `/v1/sessions/${session}/commands/${started.body.id}/stdin`, { text: 'x' }],
      ['POST', `/v1/sessions/${session}/commands/${started.body.id}/signal`, { signal: 'SIGKILL' }],
    ] as const) {
      const res = await other.call(method, route, body)
      expect(res.status, route).toBe(404)
      expect(res.body.error.code).toBe('session_not_found')
    }
  })
})

describe('commands through the SDK and the CLI', () => {
  it('runs one with the SDK: its output by stream, its exit status, its stdin', async () => {
    const client = new Cairn({ apiKey: t.key, baseUrl: t.url })
    const commands = client.sessions.commands(session)
    const result = await commands.run(['sh', '-c', 'printf out; printf err >&2; exit 4'])
    expect(result).toMatchObject({ exitCode: 4, signal: null, stdout: 'out', stderr: 'err' })
    expect(result.command.id).toMatch(/^cmd_/)
    const cat = await commands.start(['cat'], { stdin: true })
    await commands.sendStdin(cat.id, new Uint8Array([104, 105, 0]))
    await commands.closeStdin(cat.id)
    const chunks: Uint8Array[] = []
    const ended = await commands.wait(cat.id, { onOutput: (e) => e.type === 'output' && chunks.push(e.data) })
    expect(ended).toMatchObject({ status: 'exited', exitCode: 0 })
    expect(Buffer.concat(chunks)).toEqual(Buffer.from([104, 105, 0]))
    expect((await commands.list()).map((c) => c.id)).toContain(cat.id)
  })

  it("cairn sessions exec streams the output and exits with the command's status", async () => {
    assertBuilt()
    const config = await mkdtemp(path.join(os.tmpdir(), 'cairn-exec-cli-'))
    try {
      const env = { CAIRN_API_URL: t.url, CAIRN_API_KEY: t.key, CAIRN_CONFIG_DIR: config }
      const prefix = session.slice(0, 10)
      const run = await spawnCli(
        ['sessions', 'exec', prefix, '--', 'sh', '-c', 'echo to-out; echo to-err >&2; exit 7'],
        env,
      ).done
      expect(run).toMatchObject({ code: 7, stdout: 'to-out\n' })
      expect(run.stderr).toContain('to-err\n')
      const piped = await spawnCli(['sessions', 'exec', '-i', prefix, '--', 'wc', '-c'], env, {
        input: 'twelve bytes',
      }).done
      expect(piped).toMatchObject({ code: 0, stdout: '12\n' })
      const killed = await spawnCli(['sessions', 'exec', prefix, '--', 'sh', '-c', 'kill -TERM $$'], env).done
      expect(killed.code).toBe(128 + 15)
      // A terminal: what is typed (here piped) runs in a shell on a pty, and its status is the CLI's.
      const shell = await spawnCli(['sessions', 'shell', prefix], env, {
        input: 'tty; echo "sum $((40 + 2))"; exit 4\n',
      }).done
      expect(shell.code).toBe(4)
      expect(shell.stdout).toMatch(/\/dev\/pts\/\d+/)
      expect(shell.stdout).toContain('sum 42')
    } finally {
      await rm(config, { recursive: true, force: true })
    }
  })
})

describe('a terminal over WebSocket', () => {
  const socketUrl = (path: string) => `${t.url.replace(/^http/, 'ws')}${path}`
  /** The HTTP status an upgrade was refused with (or 101). */
  const upgradeStatus = (path: string, headers: Record<string, string>) =>
    new Promise<number>((resolve) => {
      const ws = new WebSocket(socketUrl(path), { headers })
      ws.once('open', () => {
        ws.close()
        resolve(101)
      })
      ws.once('unexpected-response', (_req, res) => {
        res.resume()
        resolve(res.statusCode ?? 0)
      })
      ws.once('error', () => resolve(0))
    })

  /**
   * A terminal socket on a command: its screen so far, the error messages it was sent, and its
   * exit message (refused if the socket closes first or none comes in 15 s).
   */
  const openTerminal = async (commandId: string) => {
    const path = `/v1/sessions/${session}/commands/${commandId}/terminal`
    const ws = new WebSocket(socketUrl(path), { headers: { authorization: `Bearer ${t.key}` } })
    const seen = { screen: '', bytes: 0, errors: [] as { code: string }[], gaps: [] as unknown[] }
    const exit = new Promise<{ command: { exitCode: number; outputBytes: number } }>((resolve, reject) => {
      ws.on('message', (data, binary) => {
        if (binary) {
          seen.screen += data.toString()
          seen.bytes += (data as Buffer).length
        } else {
          const message = JSON.parse(data.toString())
          if (message.type === 'exit') resolve(message)
          if (message.type === 'error') seen.errors.push(message.error)
          if (message.type === 'gap') seen.gaps.push(message)
        }
      })
      ws.once('error', reject)
      ws.once('close', () => reject(new Error(`closed before the exit: ${JSON.stringify(seen.errors)}`)))
      setTimeout(() => reject(new Error(`no exit in 15 s: ${JSON.stringify(seen)}`)), 15_000).unref()
    })
    await new Promise((resolve) => ws.once('open', resolve))
    return { ws, seen, exit }
  }

  it('runs a shell on a terminal: keystrokes in, output out, a resize, the exit status last', async () => {
    const started = await start(session, { command: ['sh'], tty: { rows: 24, cols: 80 } })
    expect(started.status, JSON.stringify(started.body)).toBe(201)
    expect(started.body.stdinOpen).toBe(true)
    const { ws, seen, exit } = await openTerminal(started.body.id)
    ws.send(JSON.stringify({ type: 'resize', rows: 33, cols: 101 }))
    // The resize (the helper's control pipe) and the keystrokes (the pty) travel apart: the shell
    // waits until its terminal has the new size (a resize never applied fails by the test's timeout).
    const keys =
      'until [ "$(stty size)" = "33 101" ]; do sleep 0.05; done; stty size; tty; echo $((6 * 7)); exit 3\n'
    ws.send(Buffer.from(keys), { binary: true })
    const ended = await exit
    expect(ended.command).toMatchObject({ status: 'exited', exitCode: 3 })
    // stty's own line (the typed line echoes "33 101" too, but not alone on a line).
    expect(seen.screen).toMatch(/(^|\n)33 101\r?\n/)
    expect(seen.screen).toMatch(/\/dev\/pts\/\d+/)
    expect(seen.screen).toContain('42')
    await new Promise((resolve) => ws.once('close', resolve))
  })

  it('takes its messages in the order sent: a line typed a key at a time, then close', async () => {
    // What `cairn sessions shell` sends with piped input: keys, then `close` at once. Each message
    // goes through the database before it reaches the command; taken concurrently, a later one
    // (`close`) could overtake the keys (on PostgreSQL it did: the shell never saw its line).
    for (let round = 0; round < 3; round++) {
      const started = await start(session, { command: ['sh'], tty: { rows: 24, cols: 80 } })
      const { ws, seen, exit } = await openTerminal(started.body.id)
      for (const key of 'echo "in $((20 + 3)) order"; exit 5\n') ws.send(Buffer.from(key), { binary: true })
      ws.send(JSON.stringify({ type: 'close' }))
      const ended = await exit
      expect(ended.command).toMatchObject({ status: 'exited', exitCode: 5 })
      expect(seen.screen).toContain('in 23 order')
      expect(seen.errors).toEqual([])
    }
  })

  it('refuses an upgrade without a key, of another tenant, or anywhere else, in HTTP', async () => {
    const started = await start(session, { command: ['true'] })
    const path = `/v1/sessions/${session}/commands/${started.body.id}/terminal`
    expect(await upgradeStatus(path, {})).toBe(401)
    const key = await t.api.call('POST', '/v1/keys', { tenant: 'terminal-other', role: 'admin' })
    expect(await upgradeStatus(path, { authorization: `Bearer ${key.body.key}` })).toBe(404)
    expect(await upgradeStatus('/v1/agents', { authorization: `Bearer ${t.key}` })).toBe(404)
    // An ID that is not valid percent-encoding is refused as the router refuses it (it was a 500).
    const auth = { authorization: `Bearer ${t.key}` }
    expect(await upgradeStatus(`/v1/sessions/%E0/commands/${started.body.id}/terminal`, auth)).toBe(400)
    expect(await upgradeStatus(`/v1/sessions/${session}/commands/%ZZ/terminal`, auth)).toBe(400)
  })

  it('answers every text message that is no control message with a typed error, in order, and goes on', async () => {
    // Any JSON value but the three control messages, and text that is not JSON: `null` was a
    // TypeError answered `internal`.
    const control = (v: unknown) =>
      typeof v === 'object' &&
      v !== null &&
      ['resize', 'signal', 'close'].includes((v as { type?: string }).type ?? '')
    const texts = fc.oneof(
      fc
        .jsonValue()
        .filter((v) => !control(v))
        .map((v) => JSON.stringify(v)),
      fc.constantFrom(
        'null',
        '[]',
        '"close"',
        '{"type":"resize","rows":"24","cols":80}',
        '{"type":"signal","signal":9}',
      ),
      fc.string().filter((s) => !/^\s*[[{"\d-]|^\s*(null|true|false)\s*$/.test(s)),
    )
    const sample = fc.sample(texts, { numRuns: 60, seed: 6 })
    const started = await start(session, { command: ['sh'], tty: { rows: 24, cols: 80 } })
    const { ws, seen, exit } = await openTerminal(started.body.id)
    for (const text of sample) ws.send(text)
    ws.send(Buffer.from('echo still-$((40 + 2)); exit 6\n'), { binary: true })
    expect((await exit).command.exitCode).toBe(6)
    expect(seen.screen).toContain('still-42')
    expect(
      seen.errors.map((e) => e.code).filter((c) => c !== 'invalid_json' && c !== 'validation_failed'),
    ).toEqual([])
    expect(seen.errors).toHaveLength(sample.length)
  })

  it('says which bytes its log no longer keeps (a gap) before the bytes after them', async () => {
    // 9 MiB, past the 8 MiB log: a terminal from offset 0 is told of the dropped start, as the
    // output stream's `gap` event tells it, so the bytes it gets and the gap add up to the output.
    const started = await start(session, { command: ['sh', '-c', 'head -c 9437184 /dev/zero; echo end'] })
    // Attached after the end (a reader keeping up while it runs misses nothing).
    const route = `/v1/sessions/${session}/commands/${started.body.id}`
    for (let i = 0; i < 300 && (await t.api.call('GET', route)).body.status === 'running'; i++)
      await new Promise((resolve) => setTimeout(resolve, 50))
    const { seen, exit } = await openTerminal(started.body.id)
    const ended = (await exit).command
    expect(seen.gaps).toEqual([{ type: 'gap', from: 0, to: expect.any(Number) }])
    const [gap] = seen.gaps as { to: number }[]
    expect(gap?.to).toBeGreaterThan(0)
    expect((gap?.to ?? 0) + seen.bytes).toBe(ended.outputBytes)
    expect(seen.screen.endsWith('end\n')).toBe(true)
  })
})
