import { Readable } from 'node:stream'
import { CairnProblem, newId } from '@cairn/protocol'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  agentSpec,
  makeRevision,
  openTestRuntime,
  sessionId,
  type TestRuntime,
  waitFor,
} from '../../test/harness.js'
import type { AgentEvent, TurnOutcome } from '../agent/types.js'
import { LocalRuntimePort } from './local-runtime-port.js'
import type { AgentSpec } from './runtime-port.js'

/** A clock the test moves by hand: the pool's usage order and cooldown deadlines follow it. */
class ManualClock {
  ms = 1_000_000
  now(): number {
    return this.ms
  }
}

let t: TestRuntime
let port: LocalRuntimePort
const clock = new ManualClock()
const REVISION = 'rev_port'
const SLOW_REVISION = 'rev_portslow'
/** Says it started, then takes a minute over every turn. */
const SLOW =
  'import sys, time\nwhile True:\n    line = input()\n    print("working", flush=True)\n    time.sleep(60)\n    print("done")\n'

const ECHO =
  'import sys\nwhile True:\n    line = input()\n    open("seen.txt", "a").write(line + "\\n") if line.startswith("write") else None\n    print("re:", line)\n'

const spec = (id: string, tenantId = 'ten_a'): AgentSpec => agentSpec(id, tenantId, 10_000)

async function turn(
  id: string,
  prompt: string,
  n: number,
): Promise<{ outcome: TurnOutcome; events: AgentEvent[] }> {
  const events: AgentEvent[] = []
  let outcome: TurnOutcome | undefined
  for await (const message of port.runTurn(id, { prompt, turn: n, turnId: newId('turn'), transcript: [] })) {
    if (message.type === 'event') events.push(message.event)
    else outcome = message.outcome
  }
  if (!outcome) throw new Error('no outcome')
  return { outcome, events }
}

async function readAll(stream: Readable): Promise<string> {
  const chunks: Buffer[] = []
  for await (const chunk of stream) chunks.push(chunk as Buffer)
  return Buffer.concat(chunks).toString('utf8')
}

beforeAll(async () => {
  t = await openTestRuntime()
  port = new LocalRuntimePort(t.runtime, { clock })
  await makeRevision(t.runtime, REVISION, { 'agent.py': ECHO, 'README.md': 'hello\n' })
  await makeRevision(t.runtime, SLOW_REVISION, { 'agent.py': SLOW })
})

afterAll(async () => {
  await port?.stopAllAgents()
  await t?.close()
})

describe('LocalRuntimePort', () => {
  it('runs a session by ID: workspace, cold start, warm turns, and reads that name no host path', async () => {
    const id = sessionId('p')
    await port.createWorkspace(id, REVISION, 'ten_a')
    expect(await port.hasWorkspace(id)).toBe(true)
    expect(await port.resumeAgent(id)).toBeUndefined()
    const agent = await port.startAgent(spec(id))
    expect(agent).toMatchObject({ sessionId: id, alive: true, isolation: 'bwrap' })
    expect(agent.sandboxId).toMatch(/^sbx_/)
    // Plain data: what crosses the port survives a trip through JSON.
    expect(JSON.parse(JSON.stringify(agent))).toEqual(agent)

    const first = await turn(id, 'write one', 1)
    expect(first.outcome).toMatchObject({ status: 'completed', text: 're: write one\n' })
    // Events arrive as the agent writes them; together they are the reply.
    expect(first.events.every((e) => e.type === 'text')).toBe(true)
    expect(first.events.map((e) => (e.type === 'text' ? e.content : '')).join('')).toBe('re: write one\n')
    await port.coolDown(id, 60_000)
    // The next turn finds the same sandbox warm.
    expect((await port.resumeAgent(id))?.sandboxId).toBe(agent.sandboxId)
    expect((await turn(id, 'hi', 2)).outcome).toMatchObject({ text: 're: hi\n' })

    const names = (await port.listFiles({ sessionId: id }, Buffer.alloc(0))).map((e) => e.name).sort()
    expect(names).toEqual(['README.md', 'agent.py', 'seen.txt'])
    const file = await port.openFile({ sessionId: id }, Buffer.from('seen.txt'))
    expect(file.size).toBe('write one\n'.length)
    expect(await readAll(file.stream)).toBe('write one\n')
    const diff = await port.diff({ revisionId: REVISION }, { sessionId: id }, REVISION)
    expect(diff).toMatchObject({ from: REVISION, added: ['seen.txt'], changed: [], deleted: [] })
    await port.stopAgent(id)
    expect(await port.agent(id)).toBeUndefined()
  })

  it('snapshots with the warm sandbox frozen, tells an unchanged workspace from a changed one, restores and forks', async () => {
    const id = sessionId('s')
    await port.createWorkspace(id, REVISION, 'ten_a')
    await port.startAgent(spec(id))
    await turn(id, 'hello', 1)
    const [generationAtSnapshot] = await port.readGenerations([id])
    const before = newId('snapshot')
    const mark = await port.snapshotWorkspace(id, before, 'ten_a')
    expect(mark).toMatchObject({ sandboxId: (await port.agent(id))?.sandboxId })
    expect(mark && (await port.unchangedSince(id, mark))).toBe(true)
    // A turn that writes changes the workspace (dirtied pages, then the subvolume).
    await turn(id, 'write two', 2)
    expect(mark && (await port.unchangedSince(id, mark))).toBe(false)

    await port.writeFile(id, 'notes/a.txt', Readable.from([Buffer.from('by the API')]))
    expect(await readAll((await port.openFile({ sessionId: id }, Buffer.from('notes/a.txt'))).stream)).toBe(
      'by the API',
    )
    await port.stopAgent(id)
    await port.restoreWorkspace(id, before, 2, 'ten_a')
    expect((await port.listFiles({ sessionId: id }, Buffer.alloc(0))).map((e) => e.name)).not.toContain(
      'notes',
    )
    expect(await port.readGenerations([id])).toEqual([2])

    const child = sessionId('f')
    await port.forkWorkspace(child, before, 'ten_a')
    expect(await port.hasTree({ sessionId: child })).toBe(true)
    // The fork carries the marker of the generation the snapshot was taken at.
    expect(await port.readGenerations([child])).toEqual([generationAtSnapshot])
    await port.deleteSnapshot(before)
    expect(await port.hasSnapshot(before)).toBe(false)
    await port.deleteWorkspace(child)
    expect(await port.hasWorkspace(child)).toBe(false)
  })

  it('writes a file whole or not at all: a body whose stream breaks leaves the old bytes, and nothing beside them', async () => {
    const id = sessionId('w')
    await port.createWorkspace(id, REVISION, 'ten_a')
    await port.writeFile(id, 'notes/kept.txt', Readable.from([Buffer.from('acknowledged')]))
    const broken = new Readable({
      read() {
        this.push(Buffer.from('half of a new'))
        this.destroy(new Error('the client went away'))
      },
    })
    await expect(port.writeFile(id, 'notes/kept.txt', broken)).rejects.toThrow('the client went away')
    const file = await port.openFile({ sessionId: id }, Buffer.from('notes/kept.txt'))
    expect(await readAll(file.stream)).toBe('acknowledged')
    expect((await port.listFiles({ sessionId: id }, Buffer.from('notes'))).map((e) => e.name)).toEqual([
      'kept.txt',
    ])
    // A whole write replaces the bytes; a directory is not replaced by a file.
    await port.writeFile(id, 'notes/kept.txt', Readable.from([Buffer.from('replaced')]))
    expect(
      await readAll((await port.openFile({ sessionId: id }, Buffer.from('notes/kept.txt'))).stream),
    ).toBe('replaced')
    await expect(port.writeFile(id, 'notes', Readable.from([Buffer.from('x')]))).rejects.toMatchObject({
      code: 'conflict',
      message: expect.stringMatching(/is a directory: a file cannot be written over it/),
    })
    expect((await port.listFiles({ sessionId: id }, Buffer.from('notes'))).map((e) => e.name)).toEqual([
      'kept.txt',
    ])
  })

  it('keeps a tenant under its sandbox cap: the least recently used idle sandbox goes, busy ones never', async () => {
    const [a, b, c] = [sessionId('a'), sessionId('b'), sessionId('c')]
    for (const id of [a, b, c]) await port.createWorkspace(id, REVISION, 'ten_cap')
    const startAdmitted = async (id: string, busy: string[] = []) => {
      const release = await port.admitAgent({
        sessionId: id,
        tenantId: 'ten_cap',
        maxSandboxesPerTenant: 2,
        busy,
      })
      try {
        await port.startAgent(spec(id, 'ten_cap'))
      } finally {
        await release()
      }
    }
    await startAdmitted(a)
    clock.ms += 1000
    await startAdmitted(b)
    clock.ms += 1000
    // a is the least recently used (by the injected clock): it makes room for c.
    await startAdmitted(c)
    expect(await port.agent(a)).toBeUndefined()
    expect((await port.agent(b))?.alive).toBe(true)
    expect((await port.agent(c))?.alive).toBe(true)
    // With every sandbox of the tenant busy, the next one is refused (retryable), nothing stopped.
    const refused = await port
      .admitAgent({ sessionId: a, tenantId: 'ten_cap', maxSandboxesPerTenant: 2, busy: [b, c] })
      .catch((error: unknown) => error)
    expect(refused).toBeInstanceOf(CairnProblem)
    expect((refused as CairnProblem).code).toBe('sandbox_limit_reached')
    expect(await port.warmCount()).toBeGreaterThanOrEqual(2)
    await port.stopAgent(b)
    await port.stopAgent(c)
  })

  it('cools a sandbox down after its keep-warm window, unless the session is in use then', async () => {
    const id = sessionId('k')
    await port.createWorkspace(id, SLOW_REVISION, 'ten_a')
    await port.startAgent(spec(id))
    // A turn of the session runs when the window ends: the sandbox stays (the node decides alone).
    const turnId = newId('turn')
    const messages = port
      .runTurn(id, { prompt: 'go', turn: 1, turnId, transcript: [] })
      [Symbol.asyncIterator]()
    expect((await messages.next()).value).toMatchObject({ type: 'event' })
    await port.coolDown(id, 50)
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect((await port.agent(id))?.alive).toBe(true)
    await port.cancelTurn(id, turnId)
    while (!(await messages.next()).done) {}
    // A cancelled stdio turn ends its sandbox: a fresh one for the rest.
    await port.startAgent(spec(id))
    await port.coolDown(id, 50)
    // Activity moves the stop later, never earlier.
    await port.keepWarm(id, 400, true)
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect((await port.agent(id))?.alive).toBe(true)
    await new Promise((resolve) => setTimeout(resolve, 400))
    expect(await port.agent(id)).toBeUndefined()
    await port.coolDown(id, 0)
  })

  it('stops a sandbox whose keep-warm window ran out during a file write once the write is done', async () => {
    const id = sessionId('h')
    await port.createWorkspace(id, REVISION, 'ten_a')
    await port.startAgent(spec(id))
    await port.coolDown(id, 50)
    // A write whose body outlasts the window: the stop waits for it (the write is in use)…
    const body = new Readable({ read() {} })
    body.push('slow')
    const writing = port.writeFile(id, 'slow.txt', body)
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect((await port.agent(id))?.alive).toBe(true)
    body.push(null)
    await writing
    // …and comes once it is done: the sandbox is not left running with no window to end it.
    expect(await waitFor(async () => (await port.agent(id)) === undefined)).toBe(true)
  })

  it('answers a turn as a stream of its messages, cancelled by turn ID or by a reader that stops', async () => {
    const id = sessionId('t')
    await port.createWorkspace(id, SLOW_REVISION, 'ten_a')
    await port.startAgent(spec(id))
    const turnId = newId('turn')
    const messages = port.runTurn(id, { prompt: 'go', turn: 1, turnId, transcript: [] })
    const seen: string[] = []
    let outcome: TurnOutcome | undefined
    for await (const message of messages) {
      if (message.type === 'event') {
        seen.push(message.event.type === 'text' ? message.event.content : message.event.type)
        // The agent is at work: a cancel names the turn, as a remote caller would.
        await port.cancelTurn(id, 'turn_other')
        await port.cancelTurn(id, turnId)
      } else outcome = message.outcome
    }
    expect(seen.join('')).toContain('working')
    expect(outcome).toMatchObject({ status: 'cancelled' })

    // A reader that leaves before the outcome cancels the turn: the agent stops, nothing waits a minute.
    await port.startAgent(spec(id))
    for await (const message of port.runTurn(id, {
      prompt: 'go',
      turn: 2,
      turnId: newId('turn'),
      transcript: [],
    }))
      if (message.type === 'event') break
    expect(await waitFor(async () => !(await port.agent(id))?.alive, 5000)).toBe(true)

    // A turn on a session without an agent ends the iteration with the error.
    await port.stopAgent(id)
    const run = async () => {
      for await (const _ of port.runTurn(id, {
        prompt: 'x',
        turn: 3,
        turnId: newId('turn'),
        transcript: [],
      })) {
      }
    }
    await expect(run()).rejects.toThrow(/no warm agent/)
  })
})
