import { type BaseEvent, HttpAgent } from '@ag-ui/client'
import { describe, expect, it } from 'vitest'
import { useProtocolServer } from './helpers/protocol-server.js'

// Each deployed agent as an AG-UI agent, driven by the protocol's own client (@ag-ui/client's
// HttpAgent): the thread is a Cairn session (its workspace kept from run to run), a run a turn.

const env = useProtocolServer()

function agentFor(key: string, threadId: string): HttpAgent {
  return new HttpAgent({
    url: `${env.t.url}/v1/agents/file-tools/ag-ui`,
    headers: { authorization: `Bearer ${key}` },
    threadId,
  })
}

/** One run of the thread with the user's `text`: the events the client saw, and its messages after. */
async function run(agent: HttpAgent, text: string) {
  agent.addMessage({ id: crypto.randomUUID(), role: 'user', content: text })
  const events: BaseEvent[] = []
  await agent.runAgent({}, { onEvent: ({ event }) => void events.push(event) })
  const reply = agent.messages.at(-1)
  return { events, types: events.map((e) => e.type), reply }
}

const cairnState = (agent: HttpAgent) =>
  (agent.state as { cairn: { sessionId: string; status: string } }).cairn

describe('AG-UI', () => {
  it("keeps a thread's workspace from run to run: the thread is one session", async () => {
    const agent = agentFor(env.t.key, `thread-${crypto.randomUUID()}`)
    const first = await run(agent, 'write note.txt hello from ag-ui')
    expect(first.types[0]).toBe('RUN_STARTED')
    expect(first.types.at(-1)).toBe('RUN_FINISHED')
    expect(first.types).toEqual(
      expect.arrayContaining([
        'STATE_SNAPSHOT',
        'TOOL_CALL_START',
        'TOOL_CALL_ARGS',
        'TOOL_CALL_END',
        'TOOL_CALL_RESULT',
        'TEXT_MESSAGE_START',
        'TEXT_MESSAGE_CONTENT',
        'TEXT_MESSAGE_END',
      ]),
    )
    const call = first.events.find((e) => e.type === 'TOOL_CALL_START') as BaseEvent & {
      toolCallName: string
    }
    expect(call.toolCallName).toBe('write_file')
    expect(first.reply).toMatchObject({ role: 'assistant', content: 'wrote note.txt' })
    const { sessionId } = cairnState(agent)
    expect(sessionId).toMatch(/^ses_/)
    expect(cairnState(agent).status).toBe('completed')

    const second = await run(agent, 'read note.txt')
    expect(second.reply).toMatchObject({ role: 'assistant', content: 'note.txt says: hello from ag-ui' })
    expect(cairnState(agent).sessionId).toBe(sessionId)
    // The client's messages hold the tool call and its result, as AG-UI front ends show them.
    expect(agent.messages.filter((m) => m.role === 'tool').length).toBe(2)

    // A thread named by the session's ID is that session too.
    const direct = await run(agentFor(env.t.key, sessionId), 'read note.txt')
    expect(direct.reply).toMatchObject({ content: 'note.txt says: hello from ag-ui' })
    const turns = await env.t.api.call('GET', `/v1/sessions/${sessionId}/turns`)
    expect(turns.body.data.map((turn: { prompt: string }) => turn.prompt)).toEqual([
      'write note.txt hello from ag-ui',
      'read note.txt',
      'read note.txt',
    ])
  })

  it("keeps tenants apart: the same thread name is another tenant's own session, a session ID not found", async () => {
    const threadId = `shared-${crypto.randomUUID()}`
    const mine = agentFor(env.t.key, threadId)
    await run(mine, 'write secret.txt tenant a')
    const theirs = agentFor(env.other.key, threadId)
    const attempt = await run(theirs, 'read secret.txt')
    expect(attempt.types.at(-1)).toBe('RUN_ERROR')
    expect(cairnState(theirs).sessionId).not.toBe(cairnState(mine).sessionId)
    await expect(
      run(agentFor(env.other.key, cairnState(mine).sessionId), 'read secret.txt'),
    ).rejects.toMatchObject({
      status: 404,
      payload: { error: { code: 'session_not_found' } },
    })
  })

  it('makes one session of a new thread that two first runs name at once', async () => {
    const live = async () => {
      const list = await env.t.api.call('GET', '/v1/sessions?agent=file-tools&limit=500')
      return new Set(
        (list.body.data as { id: string; status: string }[])
          .filter((x) => x.status !== 'deleted')
          .map((x) => x.id),
      )
    }
    const before = await live()
    const threadId = `race-${crypto.randomUUID()}`
    const [a, b] = [agentFor(env.t.key, threadId), agentFor(env.t.key, threadId)]
    const outcomes = await Promise.allSettled([run(a, 'write a.txt 1'), run(b, 'write b.txt 2')])
    const made = [...(await live())].filter((id) => !before.has(id))
    expect(made).toHaveLength(1)
    // Each run either ran in that session or met the other's turn there (409 session_busy).
    for (const [index, outcome] of outcomes.entries()) {
      if (outcome.status === 'fulfilled')
        expect(cairnState([a, b][index] as HttpAgent).sessionId).toBe(made[0])
      else expect(outcome.reason).toMatchObject({ status: 409, payload: { error: { code: 'session_busy' } } })
    }
    expect(outcomes.some((o) => o.status === 'fulfilled')).toBe(true)
  })

  it('reports a failed turn as RUN_ERROR with its code', async () => {
    const agent = agentFor(env.t.key, `thread-${crypto.randomUUID()}`)
    const failed = await run(agent, 'read missing.txt')
    const error = failed.events.at(-1) as BaseEvent & { code?: string }
    expect(error.type).toBe('RUN_ERROR')
    expect(error.code).toBe('agent_crashed')
    expect(cairnState(agent).status).toBe('failed')
  })

  it('refuses bad input with typed errors', async () => {
    const post = async (body: unknown, key = env.t.key) => {
      const res = await fetch(`${env.t.url}/v1/agents/file-tools/ag-ui`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${key}`,
          'content-type': 'application/json',
          accept: 'text/event-stream',
        },
        body: JSON.stringify(body),
      })
      return { status: res.status, body: (await res.json()) as { error: { code: string; message: string } } }
    }
    const input = {
      threadId: 'bad-input',
      runId: 'r1',
      messages: [{ id: 'm1', role: 'user', content: 'hi' }],
    }
    const notUser = await post({
      ...input,
      messages: [{ id: 'm1', role: 'tool', content: 'x', toolCallId: 'c' }],
    })
    expect(notUser.status).toBe(400)
    expect(notUser.body.error).toMatchObject({
      code: 'validation_failed',
      message: expect.stringContaining("the user's"),
    })
    const image = await post({
      ...input,
      messages: [{ id: 'm1', role: 'user', content: [{ type: 'image', url: 'x' }] }],
    })
    expect(image.body.error.message).toContain('text only')
    const noThread = await post({ runId: 'r1', messages: input.messages })
    expect(noThread.body.error).toMatchObject({
      code: 'validation_failed',
      message: expect.stringContaining('threadId'),
    })
    expect((await post({ ...input, messages: [] })).status).toBe(400)
    expect((await post(input, 'not-a-key')).status).toBe(401)
    const readOnly = await env.t.api.call('POST', '/v1/keys', { role: 'read', name: 'viewer' })
    expect((await post(input, readOnly.body.key)).status).toBe(403)
  })
})
