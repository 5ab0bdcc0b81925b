import { rm } from 'node:fs/promises'
import {
  AgentNotFoundError,
  AmbiguousIdError,
  AuthenticationError,
  Cairn,
  ConnectionError,
  NotFoundError,
  PermissionDeniedError,
  SessionBusyError,
  SessionNotFoundError,
  type StreamEvent,
  ValidationError,
} from '@cairn/sdk'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from './helpers/projects.js'
import { EXAMPLES, packDir, startTestServer, type TestServer } from './helpers/server.js'

const SLOW_AGENT = `while IFS= read -r line; do
  if [ "$line" = slow ]; then echo "starting"; sleep 30; fi
  echo "got: $line"
done
`

let t: TestServer
let client: Cairn

beforeAll(async () => {
  t = await startTestServer()
  client = new Cairn({ baseUrl: t.url, apiKey: t.key })
  await client.agents.deploy(await packDir(`${EXAMPLES}/echo`))
  const slow = await makeProject({
    'cairn.yaml': 'name: slow\ncommand: bash slow.sh\n',
    'slow.sh': SLOW_AGENT,
  })
  try {
    const { revision } = await client.agents.deploy(await packDir(slow))
    expect(revision.status).toBe('READY')
  } finally {
    await rm(slow, { recursive: true, force: true })
  }
})

afterAll(async () => {
  await t?.close()
})

/** Waits until the stream has shown `text`, so that the turn is known to be running. */
async function until(stream: AsyncIterable<StreamEvent>, text: string): Promise<void> {
  for await (const event of stream) if (event.type === 'message.delta' && event.content.includes(text)) return
}

describe('SDK against a real server', () => {
  it('creates a session, runs and streams turns, reads the transcript, ends, resumes, deletes', async () => {
    const session = await client.createSession('echo', { title: 'sdk test', keepWarmMs: 60_000 })
    expect(session.status).toBe('idle')
    const first = await session.run('hello')
    expect(first).toMatchObject({ finishReason: 'completed', sessionId: session.id, turn: 1, toolCalls: [] })
    expect(first.text.trim()).toBe('hello')

    const stream = session.stream('streamed')
    const chunks: string[] = []
    for await (const chunk of stream.textStream) chunks.push(chunk)
    expect(chunks.join('').trim()).toBe('streamed')
    const types: string[] = []
    for await (const event of stream) types.push(event.type)
    expect(types[0]).toBe('run.started')
    expect(types.at(-1)).toBe('run.completed')
    expect((await stream.result).turn).toBe(2)

    const messages = await session.messages()
    expect(messages.map((m) => `${m.role}:${m.content.trim()}`)).toEqual([
      'user:hello',
      'assistant:hello',
      'user:streamed',
      'assistant:streamed',
    ])
    expect((await session.end()).status).toBe('completed')
    expect((await session.resume()).status).toBe('idle')
    expect((await session.refresh()).turnCount).toBe(2)
    expect((await session.events()).map((e) => e.cause)).toContain('user_end')
    await session.delete()
    expect((await client.sessions.get(session.id)).status).toBe('deleted')
    await expect(client.sessions.resolve(session.id)).rejects.toBeInstanceOf(SessionNotFoundError)
  })

  it('client.run and client.stream create a session and end it', async () => {
    const result = await client.run('echo', { message: 'one shot' })
    expect(result.text.trim()).toBe('one shot')
    // A session made for one run is ephemeral: its workspace is gone, its transcript kept.
    expect((await client.sessions.get(result.sessionId)).info).toMatchObject({
      status: 'deleted',
      statusCause: 'ephemeral_end',
    })
    expect(await client.sessions.messages(result.sessionId)).toHaveLength(2)
    const stream = client.stream('echo', { message: 'streamed shot' })
    let text = ''
    for await (const chunk of stream.textStream) text += chunk
    const streamed = await stream.result
    expect(text.trim()).toBe('streamed shot')
    expect((await client.sessions.get(streamed.sessionId)).status).toBe('deleted')
    const session = await client.createSession('echo')
    const inSession = await client.run('echo', { message: 'kept', sessionId: session.id })
    expect(inSession.sessionId).toBe(session.id)
    expect((await session.refresh()).status).toBe('idle')
  })

  it('abort() cancels the running turn and the session stays usable', async () => {
    const session = await client.createSession('slow')
    const stream = session.stream('slow')
    await until(stream, 'starting')
    const busy = await session.run('too soon').catch((e: unknown) => e)
    expect(busy).toBeInstanceOf(SessionBusyError)
    expect((busy as SessionBusyError).retryable).toBe(true)
    await stream.abort()
    const result = await stream.result
    expect(result.finishReason).toBe('cancelled')
    expect(result.text).toContain('starting')
    const after = await session.run('fast')
    expect(after).toMatchObject({ finishReason: 'completed', text: 'got: fast\n' })
  })

  it('a signal and session.cancel() cancel too', async () => {
    const session = await client.createSession('slow')
    const controller = new AbortController()
    const viaSignal = session.stream('slow', { signal: controller.signal })
    await until(viaSignal, 'starting')
    controller.abort()
    expect((await viaSignal.result).finishReason).toBe('cancelled')

    const viaCancel = session.stream('slow')
    await until(viaCancel, 'starting')
    expect(await session.cancel()).toBe(true)
    const result = await viaCancel.result
    expect(result.finishReason).toBe('cancelled')
    const events: string[] = []
    for await (const event of viaCancel) events.push(event.type)
    expect(events.at(-1)).toBe('run.cancelled')
  })

  it('reads and writes workspace files, snapshots, undoes, restores, forks and exports', async () => {
    const session = await client.createSession('echo')
    await session.run('first')
    await session.files.write('notes/a.txt', 'alpha')
    expect(await session.files.readText('notes/a.txt')).toBe('alpha')
    expect((await session.files.list('notes')).map((e) => [e.name, e.type, e.size])).toEqual([
      ['a.txt', 'file', 5],
    ])
    expect((await session.files.diff()).added).toContain('notes/a.txt')
    const snapshot = await session.snapshots.create({ label: 'with a' })
    expect(snapshot).toMatchObject({ kind: 'manual', label: 'with a', sessionId: session.id })
    await session.files.delete('notes/a.txt')
    await expect(session.files.readText('notes/a.txt')).rejects.toBeInstanceOf(NotFoundError)
    const restored = await session.snapshots.restore({ snapshotId: snapshot.id })
    expect(restored.snapshot.id).toBe(snapshot.id)
    expect(await session.files.readText('notes/a.txt', { snapshot: snapshot.id })).toBe('alpha')
    expect(await session.files.readText('notes/a.txt')).toBe('alpha')
    await session.run('second')
    expect((await session.snapshots.undo()).snapshot.turn).toBe(1)
    expect((await session.snapshots.list()).map((s) => s.id)).toContain(snapshot.id)
    const fork = await session.snapshots.fork({ snapshotId: snapshot.id, title: 'fork' })
    expect(fork).toMatchObject({ title: 'fork', agentName: 'echo' })
    expect(await client.sessions.files(fork.id).readText('notes/a.txt')).toBe('alpha')
    const archive = new Uint8Array(await new Response(await session.files.export()).arrayBuffer())
    expect([archive[0], archive[1]]).toEqual([0x1f, 0x8b])
    expect((await session.manifest()).snapshotIds).toContain(snapshot.id)
  })

  it('lists status events and leases a session', async () => {
    const session = await client.createSession('echo')
    await session.run('hi')
    const events = await session.events()
    expect(events.map((e) => [e.from, e.to, e.cause])).toEqual([
      [null, 'idle', 'created'],
      ['idle', 'active', 'turn_started'],
      ['active', 'idle', 'turn_completed'],
    ])
    expect(await client.sessions.events(session.id)).toEqual(events)

    const before = Date.now()
    const lease = await session.lease(60_000)
    expect(lease).toEqual({ sessionId: session.id, leaseUntil: expect.any(String) })
    expect(Date.parse(lease.leaseUntil) - before).toBeGreaterThan(55_000)
    const longer = await client.sessions.lease(session.id, 3_600_000)
    expect(Date.parse(longer.leaseUntil)).toBeGreaterThan(Date.parse(lease.leaseUntil))
    await expect(session.lease(10)).rejects.toBeInstanceOf(ValidationError)
    await expect(client.sessions.lease('ses_00000000000000000000', 60_000)).rejects.toBeInstanceOf(
      SessionNotFoundError,
    )
  })

  it('creates sessions with and without automatic snapshots', async () => {
    const plain = await client.createSession('echo')
    expect(plain.info.autoSnapshots).toBe(true)
    const manual = await client.createSession('echo', { autoSnapshots: false })
    expect(manual.info.autoSnapshots).toBe(false)
    expect((await manual.refresh()).autoSnapshots).toBe(false)
    await manual.run('no snapshot for this')
    expect(await manual.snapshots.list()).toEqual([])
  })

  it('creates, lists and revokes API keys', async () => {
    const created = await client.keys.create({ role: 'read', name: 'sdk reader' })
    expect(created).toEqual({
      id: expect.stringMatching(/^key_/),
      key: expect.stringMatching(/^cairn_sk_/),
      tenantId: 'tnt_default',
      role: 'read',
    })
    const admin = await client.keys.create()
    expect(admin.role).toBe('admin')

    const listed = await client.keys.list()
    const reader = listed.find((k) => k.id === created.id)
    expect(reader).toEqual({
      id: created.id,
      prefix: created.key.slice(0, reader?.prefix.length),
      role: 'read',
      name: 'sdk reader',
      tenantId: 'tnt_default',
      createdAt: expect.any(String),
      lastUsedAt: null,
      revokedAt: null,
    })
    expect(created.key.startsWith(reader?.prefix ?? '?')).toBe(true)
    expect(JSON.stringify(listed)).not.toContain(created.key)

    const readClient = new Cairn({ baseUrl: t.url, apiKey: created.key })
    expect((await readClient.sessions.list()).data).toBeInstanceOf(Array)
    await expect(readClient.keys.list()).rejects.toBeInstanceOf(PermissionDeniedError)
    await expect(readClient.keys.create()).rejects.toBeInstanceOf(PermissionDeniedError)
    await expect(readClient.createSession('echo')).rejects.toBeInstanceOf(PermissionDeniedError)
    expect((await client.keys.list()).find((k) => k.id === created.id)?.lastUsedAt).toBeTypeOf('string')

    // Another tenant: its own keys, its own (empty) world.
    const other = await client.keys.create({ tenant: 'sdk-other', name: 'other admin' })
    expect(other.tenantId).toMatch(/^tnt_/)
    expect(other.tenantId).not.toBe('tnt_default')
    const otherClient = new Cairn({ baseUrl: t.url, apiKey: other.key })
    expect((await otherClient.keys.list()).map((k) => k.id)).toEqual([other.id])
    expect(await otherClient.agents.list()).toEqual([])
    await expect(otherClient.keys.create({ tenant: 'default' })).rejects.toBeInstanceOf(PermissionDeniedError)

    await client.keys.revoke(created.id)
    await client.keys.revoke(admin.id)
    expect((await client.keys.list()).find((k) => k.id === created.id)?.revokedAt).toBeTypeOf('string')
    await expect(readClient.sessions.list()).rejects.toBeInstanceOf(AuthenticationError)
    await expect(client.keys.revoke(created.id)).rejects.toBeInstanceOf(NotFoundError)
    await expect(client.keys.revoke(other.id)).rejects.toBeInstanceOf(NotFoundError)
    await otherClient.keys.revoke(other.id)
    expect((await client.agents.list()).length).toBeGreaterThan(0)
  })

  it('pages through sessions', async () => {
    await client.createSession('echo')
    await client.createSession('echo')
    const page = await client.sessions.list({ agent: 'echo', limit: 1 })
    expect(page.data).toHaveLength(1)
    expect(page.nextCursor).toBeTypeOf('string')
    const all: string[] = []
    for await (const s of client.sessions.listAll({ agent: 'echo', limit: 2 })) all.push(s.id)
    expect(new Set(all).size).toBe(all.length)
    expect(all.length).toBeGreaterThanOrEqual(3)
  })

  it('throws the error class of each code', async () => {
    await expect(client.sessions.get('ses_00000000000000000000')).rejects.toBeInstanceOf(SessionNotFoundError)
    const missing = await client.sessions.resolve('zzzzzz').catch((e: unknown) => e)
    expect(missing).toBeInstanceOf(SessionNotFoundError)
    expect(missing).toMatchObject({
      code: 'session_not_found',
      status: 404,
      message: "No session found matching 'zzzzzz'",
    })
    expect((missing as SessionNotFoundError).requestId).toBeTypeOf('string')
    const ambiguous = await client.sessions.resolve('ses_').catch((e: unknown) => e)
    expect(ambiguous).toBeInstanceOf(AmbiguousIdError)
    expect((ambiguous as AmbiguousIdError).matches.length).toBeGreaterThan(1)
    await expect(client.agents.get('nope')).rejects.toBeInstanceOf(AgentNotFoundError)
    await expect(client.createSession('nope')).rejects.toBeInstanceOf(AgentNotFoundError)
    const session = await client.createSession('echo')
    await expect(session.run('')).rejects.toBeInstanceOf(ValidationError)
    await expect(client.agents.deploy(new TextEncoder().encode('not a tarball'))).rejects.toMatchObject({
      code: 'invalid_archive',
      status: 400,
    })
    const stranger = new Cairn({ baseUrl: t.url, apiKey: 'wrong' })
    await expect(stranger.agents.list()).rejects.toBeInstanceOf(AuthenticationError)
    const nowhere = new Cairn({ baseUrl: 'http://127.0.0.1:9', apiKey: 'k' })
    await expect(nowhere.agents.list()).rejects.toBeInstanceOf(ConnectionError)
    expect((await client.health()).ok).toBe(true)
  })
})
