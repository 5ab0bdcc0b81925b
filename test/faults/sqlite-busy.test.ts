import { type ChildProcess, spawn } from 'node:child_process'
import { once } from 'node:events'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { testsRunOnPostgres } from '../helpers/postgres.js'
import { makeProject } from '../helpers/projects.js'
import { startTestServer, type TestServer } from '../helpers/server.js'

let t: TestServer
const holders: ChildProcess[] = []

beforeAll(async () => {
  t = await startTestServer()
  const project = await makeProject({
    'cairn.yaml': 'name: keeper\ncommand: python3 keeper.py\n',
    'keeper.py': [
      'import time',
      'while True:',
      '    line = input()',
      '    if line.startswith("slow"):',
      '        time.sleep(1)',
      '    open("log.txt", "a").write(line + "\\n")',
      '    print("kept", " ".join(open("log.txt").read().split()))',
    ].join('\n'),
  })
  expect((await t.api.deploy(project)).status).toBe(201)
})

afterAll(async () => {
  for (const holder of holders) if (holder.exitCode === null) holder.kill('SIGKILL')
  await t?.close()
})

/**
 * Another process (as an operator's `sqlite3` shell or a backup would) takes the database's write
 * lock and keeps it for `holdMs`, or until `release()` if that comes first. Resolves once the lock
 * is held; `released` when it is let go.
 */
async function holdWriteLock(holdMs: number): Promise<{ released: Promise<unknown>; release: () => void }> {
  const script = [
    'import select, sqlite3, sys',
    'db = sqlite3.connect(sys.argv[1], isolation_level=None)',
    'db.execute("BEGIN IMMEDIATE")',
    'print("locked", flush=True)',
    'select.select([sys.stdin], [], [], float(sys.argv[2]))',
    'db.execute("ROLLBACK")',
  ].join('\n')
  const holder = spawn('python3', ['-c', script, path.join(t.dataDir, 'cairn.db'), String(holdMs / 1000)], {
    stdio: ['pipe', 'pipe', 'inherit'],
  })
  holders.push(holder)
  const released = once(holder, 'exit')
  await new Promise<void>((resolve, reject) => {
    holder.stdout.on('data', (chunk: Buffer) => {
      if (chunk.toString().includes('locked')) resolve()
    })
    holder.once('exit', () => reject(new Error('the lock holder exited early')))
  })
  return { released, release: () => holder.stdin?.end() }
}

// SQLite's own fault (one writer per file); PostgreSQL's are in test/faults/postgres.test.ts.
describe.skipIf(testsRunOnPostgres())('SQLite busy or locked by another writer', () => {
  it('a short lock: requests wait for it (busy_timeout) and succeed', async () => {
    const session = await t.api.createSession('keeper')
    const { released } = await holdWriteLock(1500)
    expect((await t.api.send(session.id, 'one')).text).toBe('kept one\n')
    expect((await t.api.call('POST', '/v1/sessions', { agent: 'keeper' })).status).toBe(201)
    await released
  })

  it('a long lock: requests get 503 unavailable (never 500 internal), nothing half-written, then all is well', async () => {
    const session = await t.api.createSession('keeper')
    expect((await t.api.send(session.id, 'one')).text).toBe('kept one\n')
    // Held until both refusals are in, however slowly a loaded machine answers them.
    const { released, release } = await holdWriteLock(60_000)
    const create = await t.api.call('POST', '/v1/sessions', { agent: 'keeper' })
    expect(create.status).toBe(503)
    expect(create.body.error).toMatchObject({ code: 'unavailable' })
    expect(create.body.error.message).toContain('locked')
    const message = await t.api.send(session.id, 'two')
    expect(message.status).toBe(503)
    expect((message.body as { error: { code: string } }).error.code).toBe('unavailable')
    release()
    await released

    // The refused message left no trace and no lock: the session takes the next one.
    expect((await t.api.call('GET', `/v1/sessions/${session.id}`)).body).toMatchObject({
      status: 'idle',
      turnCount: 1,
    })
    expect((await t.api.send(session.id, 'two')).text).toBe('kept one two\n')
    expect((await t.api.call('GET', `/v1/sessions/${session.id}/messages`)).body.data).toHaveLength(4)
  })

  it('a lock taken while a turn runs: the reply is recorded once the lock is gone, nothing lost', async () => {
    const session = await t.api.createSession('keeper')
    const turn = t.api.send(session.id, 'slow one')
    // The turn has started (its row is written) when the agent is sleeping; then the lock comes.
    await new Promise((r) => setTimeout(r, 400))
    const { released } = await holdWriteLock(7000)
    const result = await turn
    await released
    expect(result.terminal?.type).toBe('run.completed')
    expect(result.text).toBe('kept slow one\n')
    const messages = (await t.api.call('GET', `/v1/sessions/${session.id}/messages`)).body.data
    expect(messages).toMatchObject([
      { role: 'user', content: 'slow one' },
      { role: 'assistant', content: 'kept slow one\n', status: 'completed' },
    ])
    expect((await t.api.call('GET', `/v1/sessions/${session.id}`)).body.status).toBe('idle')
  })
})
