import { type Message, Role, type StreamResponse, type Task, TaskState } from '@a2a-js/sdk'
import {
  type Client,
  ClientFactory,
  ClientFactoryOptions,
  DefaultAgentCardResolver,
  JsonRpcTransportFactory,
} from '@a2a-js/sdk/client'
import { isLegacyAgentCard } from '@a2a-js/sdk/compat/v0_3/client'
import { describe, expect, it } from 'vitest'
import { useProtocolServer } from './helpers/protocol-server.js'

// Each deployed agent as an A2A server, driven by the official A2A JavaScript SDK's client: a
// context is a Cairn session (its workspace kept from task to task), a task a turn.

const env = useProtocolServer()

/** A fetch that sends the key, and notes the JSON-RPC methods it calls. */
function keyedFetch(key: string, methods: string[] = []): typeof fetch {
  return (input, init) => {
    const headers = new Headers(init?.headers)
    headers.set('authorization', `Bearer ${key}`)
    if (typeof init?.body === 'string') methods.push(JSON.parse(init.body).method)
    return fetch(input, { ...init, headers })
  }
}

/** The SDK's client factory, its requests carrying the key (card fetch included); `legacy`: 0.3 too. */
function factoryFor(fetchImpl: typeof fetch, legacy = false): ClientFactory {
  const legacyCompat = { enabled: legacy }
  return new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [new JsonRpcTransportFactory({ fetchImpl, legacyCompat })],
      cardResolver: new DefaultAgentCardResolver({ fetchImpl, legacyCompat }),
    }),
  )
}

/** The SDK's client for an agent, from its card (found under the base URL, as any A2A client finds it). */
function clientFor(key: string, agent = 'file-tools'): Promise<Client> {
  return factoryFor(keyedFetch(key)).createFromUrl(`${env.t.url}/v1/agents/${agent}/a2a/`)
}

function userMessage(text: string, contextId = ''): Message {
  return {
    messageId: crypto.randomUUID(),
    contextId,
    taskId: '',
    role: Role.ROLE_USER,
    parts: [{ content: { $case: 'text', value: text }, metadata: undefined, filename: '', mediaType: '' }],
    metadata: undefined,
    extensions: [],
    referenceTaskIds: [],
  }
}

const send = (message: Message, returnImmediately = false) => ({
  tenant: '',
  message,
  configuration: { acceptedOutputModes: [], taskPushNotificationConfig: undefined, returnImmediately },
  metadata: undefined,
})

const texts = (parts: { content?: { $case: string; value?: unknown } }[] = []) =>
  parts.flatMap((p) => (p.content?.$case === 'text' ? [String(p.content.value)] : []))

/** A JSON-RPC answer, or Cairn's HTTP error body (whose `error.code` is a string). */
interface RpcAnswer {
  id?: unknown
  error: { code: number | string; message: string; data: { metadata?: Record<string, string> }[] }
}

function asTask(result: Message | Task): Task {
  if (!('status' in result)) throw new Error(`expected a task, got a message: ${JSON.stringify(result)}`)
  return result
}

describe('A2A', () => {
  it('serves a card naming the endpoint and the bearer scheme', async () => {
    const card = await (await clientFor(env.t.key)).getAgentCard()
    expect(card.name).toBe('file-tools')
    expect(card.supportedInterfaces[0]).toMatchObject({
      url: `${env.t.url}/v1/agents/file-tools/a2a`,
      protocolBinding: 'JSONRPC',
      protocolVersion: '1.0',
    })
    expect(card.capabilities?.streaming).toBe(true)
    expect(card.securitySchemes.cairnApiKey?.scheme).toMatchObject({
      $case: 'httpAuthSecurityScheme',
      value: { scheme: 'Bearer' },
    })
  })

  it("keeps a context's workspace from task to task (send, then stream), with the changed files", async () => {
    const client = await clientFor(env.t.key)
    const first = asTask(await client.sendMessage(send(userMessage('write note.txt hello from a2a'))))
    expect(first.status?.state).toBe(TaskState.TASK_STATE_COMPLETED)
    expect(first.contextId).toMatch(/^ses_/)
    expect(first.id).toMatch(/^trn_/)
    expect(texts(first.status?.message?.parts)).toEqual(['wrote note.txt'])
    const files = first.artifacts.find((a) => a.name === 'changed files')
    const listed = files?.parts.find((p) => p.content?.$case === 'data')?.content?.value
    expect(listed).toMatchObject({ added: ['note.txt'] })
    const link = files?.parts.find((p) => p.content?.$case === 'url')?.content?.value as string
    const file = await fetch(link, { headers: { authorization: `Bearer ${env.t.key}` } })
    expect(await file.text()).toBe('hello from a2a')

    const events: StreamResponse[] = []
    for await (const event of client.sendMessageStream(send(userMessage('read note.txt', first.contextId))))
      events.push(event)
    const [opened] = events
    expect(opened?.payload?.$case).toBe('task')
    const secondId = opened?.payload?.$case === 'task' ? opened.payload.value.id : ''
    expect(opened?.payload?.value.contextId).toBe(first.contextId)
    const chunks = events.flatMap((e) =>
      e.payload?.$case === 'artifactUpdate' && e.payload.value.artifact?.name === 'reply'
        ? texts(e.payload.value.artifact.parts)
        : [],
    )
    expect(chunks.join('')).toBe('note.txt says: hello from a2a')
    const toolCall = events.find(
      (e) =>
        e.payload?.$case === 'statusUpdate' &&
        e.payload.value.status?.message?.parts[0]?.content?.$case === 'data',
    )
    expect(toolCall?.payload?.value).toMatchObject({
      status: { state: TaskState.TASK_STATE_WORKING },
    })
    const last = events.at(-1)
    expect(last?.payload?.$case).toBe('statusUpdate')
    expect(last?.payload?.$case === 'statusUpdate' && last.payload.value.status?.state).toBe(
      TaskState.TASK_STATE_COMPLETED,
    )

    // The task is the turn: read back by its ID.
    const again = await client.getTask({ tenant: '', id: secondId })
    expect(again.status?.state).toBe(TaskState.TASK_STATE_COMPLETED)
    expect(again.contextId).toBe(first.contextId)
    expect(again.history.map((m) => texts(m.parts)[0])).toEqual([
      'read note.txt',
      'note.txt says: hello from a2a',
    ])
  })

  it('follows a running task from another connection, cancels it, and refuses to cancel an ended one', async () => {
    const client = await clientFor(env.t.key)
    const started = asTask(await client.sendMessage(send(userMessage('sleep 60'), true)))
    expect(started.status?.state).toBe(TaskState.TASK_STATE_WORKING)
    const followed: StreamResponse[] = []
    let cancelled: Task | undefined
    for await (const event of client.resubscribeTask({ tenant: '', id: started.id })) {
      followed.push(event)
      const reply =
        event.payload?.$case === 'artifactUpdate' ? texts(event.payload.value.artifact?.parts) : []
      if (reply.includes('sleeping'))
        cancelled = await client.cancelTask({ tenant: '', id: started.id, metadata: undefined })
    }
    expect(followed[0]?.payload?.$case).toBe('task')
    const last = followed.at(-1)?.payload
    expect(last?.$case === 'statusUpdate' && last.value.status?.state).toBe(TaskState.TASK_STATE_CANCELED)
    expect(cancelled?.status?.state).toBe(TaskState.TASK_STATE_CANCELED)
    await expect(
      client.cancelTask({ tenant: '', id: started.id, metadata: undefined }),
    ).rejects.toMatchObject({
      name: 'TaskNotCancelableError',
    })
  })

  it('speaks A2A 0.3 to a 0.3 client (message/send, message/stream, tasks/get) in the same sessions', async () => {
    const card = await fetch(`${env.t.url}/v1/agents/file-tools/a2a/.well-known/agent-card.json`, {
      headers: { authorization: `Bearer ${env.t.key}` },
    }).then((res) => res.json())
    // A client that sends no A2A-Version is a 0.3 one: the card it gets is 0.3's, as the SDK reads it.
    expect(isLegacyAgentCard(card)).toBe(true)
    expect(card).toMatchObject({ protocolVersion: '0.3.0', url: `${env.t.url}/v1/agents/file-tools/a2a` })
    const methods: string[] = []
    const client = await factoryFor(keyedFetch(env.t.key, methods), true).createFromAgentCard(card)
    expect(client.protocolVersion).toMatch(/^0\.3/)

    const first = asTask(await client.sendMessage(send(userMessage('write old.txt from 0.3'))))
    expect(first.status?.state).toBe(TaskState.TASK_STATE_COMPLETED)
    const events: StreamResponse[] = []
    for await (const event of client.sendMessageStream(send(userMessage('read old.txt', first.contextId))))
      events.push(event)
    const reply = events.flatMap((e) =>
      e.payload?.$case === 'artifactUpdate' && e.payload.value.artifact?.name === 'reply'
        ? texts(e.payload.value.artifact.parts)
        : [],
    )
    expect(reply.join('')).toBe('old.txt says: from 0.3')
    const again = await client.getTask({ tenant: '', id: first.id })
    expect(again.contextId).toBe(first.contextId)
    expect(methods).toEqual(['message/send', 'message/stream', 'tasks/get'])
  })

  it("keeps tenants apart: another tenant's key reaches neither the context nor the task", async () => {
    const mine = asTask(
      await (await clientFor(env.t.key)).sendMessage(send(userMessage('write secret.txt tenant a'))),
    )
    const theirs = await clientFor(env.other.key)
    await expect(theirs.getTask({ tenant: '', id: mine.id })).rejects.toMatchObject({
      name: 'TaskNotFoundError',
    })
    await expect(
      theirs.sendMessage(send(userMessage('read secret.txt', mine.contextId))),
    ).rejects.toMatchObject({
      name: 'RequestMalformedError',
      message: expect.stringContaining('No session found'),
    })
    await expect(theirs.cancelTask({ tenant: '', id: mine.id, metadata: undefined })).rejects.toMatchObject({
      name: 'TaskNotFoundError',
    })
    // Their own agent's new context is a session of theirs, with a workspace of its own.
    const own = asTask(await theirs.sendMessage(send(userMessage('read secret.txt'))))
    expect(own.contextId).not.toBe(mine.contextId)
    expect(own.status?.state).toBe(TaskState.TASK_STATE_FAILED)
  })

  it('refuses bad input with typed errors', async () => {
    const rpc = async (body: unknown, headers: Record<string, string> = { 'a2a-version': '1.0' }) => {
      const res = await fetch(`${env.t.url}/v1/agents/file-tools/a2a`, {
        method: 'POST',
        headers: { authorization: `Bearer ${env.t.key}`, 'content-type': 'application/json', ...headers },
        body: JSON.stringify(body),
      })
      return { status: res.status, body: (await res.json()) as RpcAnswer }
    }
    const call = (method: string, params: unknown) => ({ jsonrpc: '2.0', id: 7, method, params })
    const text = { messageId: 'm1', role: 'ROLE_USER', parts: [{ text: 'hi' }] }

    const noParts = await rpc(call('SendMessage', { message: { ...text, parts: [] } }))
    expect(noParts.body).toMatchObject({ id: 7, error: { code: -32602 } })
    expect(noParts.body.error.message).toContain('/message/parts')
    expect(noParts.body.error.data[0].metadata).toEqual({ code: 'validation_failed' })

    const file = await rpc(
      call('SendMessage', { message: { ...text, parts: [{ url: 'https://x.test/a' }] } }),
    )
    expect(file.body.error).toMatchObject({
      code: -32602,
      message: expect.stringContaining('text parts only'),
    })

    const unknownContext = await rpc(call('SendMessage', { message: { ...text, contextId: 'ses_nope' } }))
    expect(unknownContext.body.error.data[0].metadata).toEqual({ code: 'session_not_found' })

    const noTask = await rpc(call('GetTask', { id: 'turn_nope' }))
    expect(noTask.body.error).toMatchObject({ code: -32001 })

    expect((await rpc(call('NoSuchMethod', {}))).body.error).toMatchObject({ code: -32601 })
    const version = await rpc(call('SendMessage', { message: text }), { 'a2a-version': '2.0' })
    expect(version.body.error).toMatchObject({ code: -32009 })
    // Without A2A-Version the request is 0.3's, whose methods have other names.
    expect((await rpc(call('SendMessage', { message: text }), {})).body.error).toMatchObject({ code: -32601 })
    const legacy = await rpc(
      call('message/send', { message: { kind: 'message', messageId: 'm', role: 'user', parts: [] } }),
      {},
    )
    expect(legacy.body.error).toMatchObject({
      code: -32602,
      message: expect.stringContaining('/message/parts'),
    })

    const envelope = await rpc({ jsonrpc: '1.0', id: 1, method: 'GetTask', params: {} })
    expect(envelope.status).toBe(400)
    expect(envelope.body.error.code).toBe('validation_failed')

    const anonymous = await fetch(`${env.t.url}/v1/agents/file-tools/a2a/.well-known/agent-card.json`)
    expect(anonymous.status).toBe(401)
    await expect(clientFor(env.t.key, 'no-such-agent')).rejects.toThrow(/404/)
  })
})
