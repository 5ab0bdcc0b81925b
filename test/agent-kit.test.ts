import type { StreamEvent } from '@cairn/protocol'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from './helpers/projects.js'
import { type RunResult, startTestServer, type TestServer } from './helpers/server.js'

// Agents written with the agent kit (packages/agent-kit/python and node), which every sandbox
// sees at /opt/cairn without installing anything. Each turn: a status, a tool call with output, a
// tool call that throws, and text that includes what transcript() saw.

const PYTHON_AGENT = `
import os
from cairn_agent import tool, turns

@tool("add")
def add(a, b):
    return a + b

for turn in turns():
    print("a stray print goes to stderr, not into the protocol")
    turn.status("thinking about turn %d" % turn.turn)
    with tool("list_files", {"path": "."}) as call:
        call.output = sorted(os.listdir("."))
    try:
        with turn.tool("explode", {"why": "testing"}):
            raise ValueError("kaboom")
    except ValueError:
        pass
    total = add(2, b=3)
    history = turn.transcript()
    turn.write("py heard: %s\\n" % turn.content)
    turn.write("sum=%d history=%s" % (total, "|".join("%s:%s" % (m["role"], m["content"]) for m in history)))
    turn.metadata({"turnId": turn.turn_id})
    if turn.content == "fail please":
        turn.error("asked to fail")
`

const NODE_AGENT = `
import { readdirSync } from 'node:fs'
import { tool, turns } from '/opt/cairn/node/index.mjs'

const add = tool('add', async ({ a, b }) => a + b)

for await (const turn of turns()) {
  console.log('a stray console.log goes to stderr')
  turn.status(\`thinking about turn \${turn.turn}\`)
  const id = turn.toolStart('list_files', { path: '.' })
  turn.toolEnd(id, readdirSync('.').sort())
  await turn
    .tool('explode', { why: 'testing' }, () => {
      throw new RangeError('kaboom')
    })
    .catch(() => undefined)
  const total = await add({ a: 2, b: 3 })
  const history = turn.transcript().map((m) => \`\${m.role}:\${m.content}\`)
  turn.write(\`node heard: \${turn.content}\\n\`)
  turn.write(\`sum=\${total} history=\${history.join('|')}\`)
  turn.done()
}
`

const CJS_AGENT = `
const { turns } = require('cairn-agent')

;(async () => {
  for await (const turn of turns()) {
    const id = turn.toolStart('upper', { text: turn.content })
    turn.toolEnd(id, turn.content.toUpperCase())
    turn.write('cjs heard: ' + turn.content)
  }
})()
`

let t: TestServer

beforeAll(async () => {
  t = await startTestServer()
  const projects = {
    'kit-python': {
      'cairn.yaml': 'name: kit-python\ncommand: python3 agent.py\nprotocol: jsonl\n',
      'agent.py': PYTHON_AGENT,
    },
    'kit-node': {
      'cairn.yaml': 'name: kit-node\ncommand: node agent.mjs\nprotocol: jsonl\n',
      'agent.mjs': NODE_AGENT,
    },
    'kit-cjs': {
      'cairn.yaml': 'name: kit-cjs\ncommand: node agent.js\nprotocol: jsonl\n',
      'agent.js': CJS_AGENT,
    },
  }
  for (const files of Object.values(projects)) {
    const res = await t.api.deploy(await makeProject(files))
    expect(res.status, JSON.stringify(res.body)).toBe(201)
    expect(res.body.revision.status).toBe('READY')
  }
})

afterAll(async () => {
  await t?.close()
})

function only<T extends StreamEvent['type']>(run: RunResult, type: T) {
  return run.events.filter((e): e is Extract<StreamEvent, { type: T }> => e.type === type)
}

/** The shared expectations of one turn of the Python or Node kit agent. */
function expectKitTurn(run: RunResult, turn: number) {
  expect(run.terminal?.type, JSON.stringify(run.events)).toBe('run.completed')
  const types = run.events.map((e) => e.type)
  expect(types[0]).toBe('run.started')
  expect(types.at(-1)).toBe('run.completed')
  // (The Python agent also sends metadata, which the server may relay as a status line of its own.)
  const statuses = only(run, 'status').map((e) => e.message)
  expect(statuses.filter((m) => m.startsWith('thinking'))).toEqual([`thinking about turn ${turn}`])
  // Status comes before the first tool call, text after the last one: the frames keep their order.
  expect(types.indexOf('status')).toBeLessThan(types.indexOf('tool.start'))
  expect(types.lastIndexOf('tool.end')).toBeLessThan(types.indexOf('message.delta'))

  const starts = only(run, 'tool.start')
  const ends = only(run, 'tool.end')
  expect(starts.map((e) => e.name)).toEqual(['list_files', 'explode', 'add'])
  expect(starts.map((e) => e.input)).toEqual([{ path: '.' }, { why: 'testing' }, { a: 2, b: 3 }])
  expect(new Set(starts.map((e) => e.toolCallId)).size).toBe(3)
  expect(ends.map((e) => e.toolCallId)).toEqual(starts.map((e) => e.toolCallId))

  const [list, explode, add] = ends
  expect(Array.isArray(list?.output)).toBe(true)
  expect(list?.output).toContain('cairn.yaml')
  expect(list?.isError).toBeFalsy()
  expect(explode?.isError).toBe(true)
  expect(String(explode?.output)).toMatch(/^(ValueError|RangeError): kaboom$/)
  expect(add).toMatchObject({ output: 5 })
  expect(add?.isError).toBeFalsy()
}

describe('agent kit (jsonl protocol helpers in every sandbox)', () => {
  for (const [agent, prefix, entry] of [
    ['kit-python', 'py', 'agent.py'],
    ['kit-node', 'node', 'agent.mjs'],
  ] as const) {
    it(`${agent}: streams status, tool calls and text, and reads its transcript on turn 2`, async () => {
      const session = await t.api.createSession(agent)
      const first = await t.api.send(session.id, 'hello kit')
      expectKitTurn(first, 1)
      expect(only(first, 'tool.end')[0]?.output).toContain(entry)
      expect(first.text).toBe(`${prefix} heard: hello kit\nsum=5 history=`)
      expect((first.terminal as { text: string }).text).toBe(first.text)

      const second = await t.api.send(session.id, 'again: naïve ✓ 🐈')
      expectKitTurn(second, 2)
      expect(second.text).toBe(
        `${prefix} heard: again: naïve ✓ 🐈\nsum=5 history=user:hello kit|assistant:${first.text}`,
      )
      // The process stayed warm: the kit ended turn 1 and waited for the next message.
      expect(second.events[0]).toMatchObject({ type: 'run.started', coldStart: false })
      const tools = only(second, 'tool.start').map((e) => e.toolCallId)
      expect(tools.some((id) => only(first, 'tool.start').some((e) => e.toolCallId === id))).toBe(false)
    })
  }

  it('kit-python: turn.error() fails the turn with its message and the agent answers the next one', async () => {
    const session = await t.api.createSession('kit-python')
    const failed = await t.api.send(session.id, 'fail please')
    expect(failed.terminal).toMatchObject({ type: 'run.failed', error: { message: 'asked to fail' } })
    expect(failed.text).toContain('py heard: fail please')
    const next = await t.api.send(session.id, 'still there?')
    expect(next.terminal?.type).toBe('run.completed')
    expect(next.text).toContain('py heard: still there?')
    expect(next.events[0]).toMatchObject({ coldStart: false })
  })

  it("kit-cjs: require('cairn-agent') resolves through NODE_PATH", async () => {
    const session = await t.api.createSession('kit-cjs')
    for (const word of ['one', 'two']) {
      const run = await t.api.send(session.id, word)
      expect(run.terminal?.type, JSON.stringify(run.events)).toBe('run.completed')
      expect(run.text).toBe(`cjs heard: ${word}`)
      expect(only(run, 'tool.end')).toEqual([expect.objectContaining({ output: word.toUpperCase() })])
    }
  })
})
