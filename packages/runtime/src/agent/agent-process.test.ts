import { existsSync, readFileSync, statSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  instanceProcesses,
  liveSandboxCgroups,
  makeRevision,
  openTestRuntime,
  poolMounts,
  reply,
  SANDBOX_UID,
  sandboxCgroupDirs,
  startAgent,
  type TestRuntime,
  turn,
} from '../../test/harness.js'
import type { AgentEvent } from './types.js'

// Each stdio agent understands the same three messages, so one script of turns checks them all:
// `write <text>` stores text in /workspace/notes.txt, `read` answers with it, anything else is echoed.
const BASH_AGENT = `echo "bash agent starting"
while IFS= read -r line; do
  case "$line" in
    write\\ *) printf '%s\\n' "\${line#write }" > notes.txt; echo "wrote";;
    read) cat notes.txt;;
    *) echo "bash: $line";;
  esac
done
`

const PYTHON_AGENT = `print("python agent starting")

def handle(line):
    if line.startswith("write "):
        with open("notes.txt", "w") as f:
            f.write(line[6:] + "\\n")
        print("wrote")
    elif line == "read":
        print(open("notes.txt").read(), end="")
    else:
        print("python:", line)

while True:
    handle(input("> "))
`

const NODE_HANDLER = `import { readFileSync, writeFileSync } from 'node:fs'
export function handle(line) {
  if (line.startsWith('write ')) {
    writeFileSync('notes.txt', line.slice(6) + '\\n')
    console.log('wrote')
  } else if (line === 'read') {
    process.stdout.write(readFileSync('notes.txt', 'utf8'))
  } else {
    console.log('node: ' + line)
  }
}
`

const NODE_FOR_AWAIT = `import readline from 'node:readline'
import { handle } from './handler.mjs'
console.log('node agent starting')
const rl = readline.createInterface({ input: process.stdin })
for await (const line of rl) handle(line)
`

const NODE_ON_LINE = `import readline from 'node:readline'
import { handle } from './handler.mjs'
console.log('node agent starting')
const rl = readline.createInterface({ input: process.stdin })
rl.on('line', (line) => handle(line))
`

const NODE_QUESTION = `import readline from 'node:readline'
import { handle } from './handler.mjs'
console.log('node agent starting')
const rl = readline.createInterface({ input: process.stdin, output: process.stdout })
const ask = () => rl.question('> ', (line) => { handle(line); ask() })
ask()
`

const NODE_QUESTION_PROMISES = `import readline from 'node:readline/promises'
import { handle } from './handler.mjs'
console.log('node agent starting')
const rl = readline.createInterface({ input: process.stdin, output: process.stdout })
for (;;) handle(await rl.question('> '))
`

const PYTHON_STDIN_ITER = `import sys
print("banner")
for line in sys.stdin:
    print("iter:", line.rstrip("\\n"))
`

const PYTHON_ONE_SHOT = `line = input()
print("bye", line)
`

const PYTHON_CRASH = `print("python agent starting")
while True:
    line = input()
    if line == "crash":
        print("partial output")
        raise RuntimeError("boom from the agent")
    print("ok", line)
`

const PYTHON_HANG = `import time
while True:
    line = input()
    if line == "hang":
        print("working on it", flush=True)
        time.sleep(60)
    print("ok", line)
`

const PYTHON_WHOAMI = `import os
while True:
    line = input()
    if line.startswith("write "):
        open("seen.txt", "w").write(line[6:])
    seen = open("seen.txt").read() if os.path.exists("seen.txt") else "-"
    fresh = not os.path.exists("/tmp/sandbox-marker")
    open("/tmp/sandbox-marker", "a").close()
    started = open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]
    print(os.readlink("/proc/self/ns/pid"), os.getpid(), started, "fresh" if fresh else "warm", seen)
`

const PYTHON_ENV = `import json, os
while True:
    line = input()
    turn = open("/run/cairn/turn").read().strip()
    lines = [json.loads(l) for l in open(os.environ["CAIRN_TRANSCRIPT"])]
    print(os.environ["CAIRN_SESSION_ID"], os.environ["CAIRN_PROTOCOL"], turn, json.dumps(lines, separators=(",", ":")))
`

const JSONL_AGENT = `import json, sys

def send(frame):
    sys.stdout.write(json.dumps(frame) + "\\n")
    sys.stdout.flush()

send({"type": "ready"})
for raw in sys.stdin:
    msg = json.loads(raw)
    content = msg["content"]
    if content == "not json":
        print("this is not a frame", flush=True)
        continue
    if content == "bad frame":
        send({"type": "text", "text": "wrong field"})
        continue
    if content == "error":
        send({"type": "error", "message": "the tool exploded"})
        continue
    send({"type": "status", "message": "thinking"})
    send({"type": "tool.start", "id": "t1", "name": "list_files", "input": {"path": "."}})
    send({"type": "tool.end", "id": "t1", "output": ["a.txt"], "isError": False})
    send({"type": "metadata", "data": {"turn": msg["turn"], "turnId": msg["turnId"]}})
    send({"type": "text", "content": "you said: "})
    send({"type": "text", "content": content})
    send({"type": "turn.done"})
`

const EXEC_AGENT = `msg=$(cat)
echo "$msg" >> runs.txt
case "$msg" in
  fail*) echo "partial"; echo "first stderr line" >&2; echo "fatal: cannot do $msg" >&2; exit 3;;
esac
printf 'exec got: %s\\n' "$msg"
printf 'runs: %s\\n' "$(wc -l < runs.txt)"
readlink /proc/self/ns/pid
`

let t: TestRuntime

beforeAll(async () => {
  t = await openTestRuntime()
  await makeRevision(t.runtime, 'rev_agents', {
    'echo.sh': BASH_AGENT,
    'agent.py': PYTHON_AGENT,
    'handler.mjs': NODE_HANDLER,
    'for-await.mjs': NODE_FOR_AWAIT,
    'on-line.mjs': NODE_ON_LINE,
    'question.mjs': NODE_QUESTION,
    'question-promises.mjs': NODE_QUESTION_PROMISES,
    'iter.py': PYTHON_STDIN_ITER,
    'one-shot.py': PYTHON_ONE_SHOT,
    'crash.py': PYTHON_CRASH,
    'hang.py': PYTHON_HANG,
    'whoami.py': PYTHON_WHOAMI,
    'env.py': PYTHON_ENV,
    'jsonl.py': JSONL_AGENT,
    'exec.sh': EXEC_AGENT,
  })
})

afterAll(async () => {
  const runtime = t.runtime
  await t.close()
  expect(poolMounts(runtime)).toBe(0)
})

describe('stdio protocol', () => {
  const shims: Array<[string, string[], string]> = [
    ['bash while-read loop', ['bash', 'echo.sh'], 'bash: '],
    ['python input()/print() loop', ['python3', 'agent.py'], 'python: '],
    ['node readline for-await loop', ['node', 'for-await.mjs'], 'node: '],
    ["node readline rl.on('line')", ['node', 'on-line.mjs'], 'node: '],
    ['node readline rl.question callback', ['node', 'question.mjs'], 'node: '],
    ['node readline/promises rl.question', ['node', 'question-promises.mjs'], 'node: '],
  ]

  it.each(shims)(
    '%s: exact multi-turn replies, state kept in the workspace',
    async (_name, command, prefix) => {
      const { agent, workspaceDir } = await startAgent(t.runtime, 'rev_agents', command)
      try {
        expect(await reply(agent, 'write remember the blue door', 1)).toBe('wrote\n')
        expect(await reply(agent, 'hello', 2)).toBe(`${prefix}hello\n`)
        expect(await reply(agent, 'unicode ✓ héllo 日本', 3)).toBe(`${prefix}unicode ✓ héllo 日本\n`)
        expect(await reply(agent, 'line one\nline two', 4)).toBe(`${prefix}line one line two\n`)
        expect(await reply(agent, 'read', 5)).toBe('remember the blue door\n')
        expect(agent.alive).toBe(true)
        const notes = path.join(workspaceDir, 'notes.txt')
        expect(readFileSync(notes, 'utf8')).toBe('remember the blue door\n')
        expect(statSync(notes).uid).toBe(SANDBOX_UID)
      } finally {
        await t.runtime.stopAgent(agent)
      }
    },
  )

  it('does not count a banner printed before the first input as part of turn 1', async () => {
    for (const command of [
      ['bash', 'echo.sh'],
      ['python3', 'agent.py'],
      ['node', 'for-await.mjs'],
    ]) {
      const { agent } = await startAgent(t.runtime, 'rev_agents', command)
      try {
        const { outcome, events } = await turn(agent, 'ping', 1)
        expect(outcome.status).toBe('completed')
        expect(outcome.text).not.toContain('starting')
        expect(outcome.text).toMatch(/^\w+: ping\n$/)
        expect(events.map((e) => (e.type === 'text' ? e.content : e.type)).join('')).toBe(outcome.text)
      } finally {
        await t.runtime.stopAgent(agent)
      }
    }
  })

  it('supports iterating over sys.stdin in python', async () => {
    const { agent } = await startAgent(t.runtime, 'rev_agents', ['python3', 'iter.py'])
    try {
      expect(await reply(agent, 'a', 1)).toBe('iter: a\n')
      expect(await reply(agent, 'b', 2)).toBe('iter: b\n')
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  it('completes the turn when the agent exits cleanly after answering', async () => {
    const { agent } = await startAgent(t.runtime, 'rev_agents', ['python3', 'one-shot.py'])
    try {
      const { outcome } = await turn(agent, 'now', 1)
      expect(outcome).toMatchObject({ status: 'completed', text: 'bye now\n', agentExited: true })
      expect(agent.alive).toBe(false)
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  it('takes the output of an agent without a shim that exits after answering as its reply', async () => {
    // dash gets no shim, so it never asks: its exit ends the turn.
    const { agent } = await startAgent(t.runtime, 'rev_agents', [
      'sh',
      '-c',
      'echo starting; read x; echo "got $x"',
    ])
    try {
      const { outcome, events } = await turn(agent, 'plain', 1)
      expect(outcome).toMatchObject({ status: 'completed', text: 'starting\ngot plain\n', agentExited: true })
      expect(events).toEqual([{ type: 'text', content: 'starting\ngot plain\n' }])
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  it('gives the agent its session id, protocol, turn number and transcript', async () => {
    const { agent, sessionId } = await startAgent(t.runtime, 'rev_agents', ['python3', 'env.py'])
    try {
      const transcript = [
        { v: 1 as const, role: 'user' as const, turn: 1, content: 'first' },
        { v: 1 as const, role: 'assistant' as const, turn: 1, content: 'answer' },
      ]
      const first = await agent.runTurn({ prompt: 'x', turn: 1, turnId: 'trn_a', transcript: [] }, () => {})
      expect(first).toMatchObject({ status: 'completed', text: `${sessionId} stdio 1 []\n` })
      const second = await agent.runTurn({ prompt: 'y', turn: 2, turnId: 'trn_b', transcript }, () => {})
      expect(second).toMatchObject({
        status: 'completed',
        text: `${sessionId} stdio 2 ${JSON.stringify(transcript)}\n`,
      })
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  it('refuses a second turn while one is running', async () => {
    const { agent } = await startAgent(t.runtime, 'rev_agents', ['python3', 'agent.py'])
    try {
      const first = agent.runTurn({ prompt: 'a', turn: 1, turnId: 'trn_a', transcript: [] }, () => {})
      await expect(
        agent.runTurn({ prompt: 'b', turn: 2, turnId: 'trn_b', transcript: [] }, () => {}),
      ).rejects.toThrow(/already running/)
      expect(await first).toMatchObject({ status: 'completed', text: 'python: a\n' })
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })
})

describe('a crashing agent', () => {
  it('fails the turn with agent_crashed, keeps the partial output and the traceback', async () => {
    const { agent } = await startAgent(t.runtime, 'rev_agents', ['python3', 'crash.py'])
    try {
      expect(await reply(agent, 'hi', 1)).toBe('ok hi\n')
      const { outcome } = await turn(agent, 'crash', 2)
      expect(outcome.status).toBe('failed')
      if (outcome.status !== 'failed') return
      expect(outcome.code).toBe('agent_crashed')
      expect(outcome.cause).toBe('agent_crash')
      expect(outcome.text).toBe('partial output\n')
      expect(outcome.stderr).toContain('Traceback (most recent call last)')
      expect(outcome.stderr).toContain('RuntimeError: boom from the agent')
      expect(outcome.message).toContain('exited with code 1')
      expect(outcome.message).toContain('RuntimeError: boom from the agent')
      expect(agent.alive).toBe(false)
      for (const dir of sandboxCgroupDirs(t.runtime, agent.sandboxId))
        expect(existsSync(dir), dir).toBe(false)
      await expect(
        agent.runTurn({ prompt: 'again', turn: 3, turnId: 'trn_c', transcript: [] }, () => {}),
      ).rejects.toThrow(/not running/)
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })
})

describe('a turn that does not end', () => {
  it('fails with turn_timeout after turnTimeoutMs and stops the sandbox', async () => {
    const { agent } = await startAgent(t.runtime, 'rev_agents', ['python3', 'hang.py'], {
      turnTimeoutMs: 500,
    })
    try {
      expect(await reply(agent, 'quick', 1)).toBe('ok quick\n')
      const before = instanceProcesses(t.runtime, { zombies: true })
      const started = Date.now()
      const { outcome } = await turn(agent, 'hang', 2)
      expect(Date.now() - started).toBeGreaterThanOrEqual(450)
      expect(outcome).toMatchObject({
        status: 'failed',
        code: 'timeout',
        cause: 'turn_timeout',
        text: 'working on it\n',
      })
      expect(agent.alive).toBe(false)
      expect(liveSandboxCgroups(t.runtime)).toEqual([])
      expect(instanceProcesses(t.runtime, { zombies: true, except: before })).toEqual([])
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  it('is cancelled by its abort signal, keeping the partial reply', async () => {
    const { agent } = await startAgent(t.runtime, 'rev_agents', ['python3', 'hang.py'])
    const before = instanceProcesses(t.runtime, { zombies: true })
    try {
      const abort = new AbortController()
      const events: AgentEvent[] = []
      const running = agent.runTurn(
        { prompt: 'hang', turn: 1, turnId: 'trn_a', transcript: [] },
        (event) => {
          events.push(event)
          // print() may write the text and its newline separately: cancel once the line is whole.
          if (event.type === 'text' && event.content.endsWith('\n')) abort.abort()
        },
        abort.signal,
      )
      expect(await running).toMatchObject({ status: 'cancelled', text: 'working on it\n' })
      expect(events.map((e) => (e.type === 'text' ? e.content : e.type)).join('')).toBe('working on it\n')
      expect(agent.alive).toBe(false)
      expect(instanceProcesses(t.runtime, { zombies: true, except: before })).toEqual([])
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  it('is cancelled at once when its signal is already aborted', async () => {
    const { agent } = await startAgent(t.runtime, 'rev_agents', ['python3', 'hang.py'])
    try {
      const outcome = await agent.runTurn(
        { prompt: 'hi', turn: 1, turnId: 'trn_a', transcript: [] },
        () => {},
        AbortSignal.abort(),
      )
      expect(outcome).toMatchObject({ status: 'cancelled', text: '' })
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })
})

describe('keeping the process warm', () => {
  it('answers every turn of one AgentProcess from the same process, and a new one from a fresh sandbox', async () => {
    const first = await startAgent(t.runtime, 'rev_agents', ['python3', 'whoami.py'])
    try {
      // [pid namespace, pid, process start time, sandbox /tmp fresh or warm, workspace file]
      const a = (await reply(first.agent, 'write kept', 1)).trim().split(' ')
      const b = (await reply(first.agent, 'again', 2)).trim().split(' ')
      const c = (await reply(first.agent, 'and again', 3)).trim().split(' ')
      expect(a[0]).toMatch(/^pid:\[\d+\]$/)
      expect(a.slice(3)).toEqual(['fresh', 'kept'])
      expect(b).toEqual([...a.slice(0, 3), 'warm', 'kept'])
      expect(c).toEqual(b)
      // The sandbox has its own pid namespace: the agent is one of its first processes.
      expect(Number(a[1])).toBeLessThan(10)
    } finally {
      await t.runtime.stopAgent(first.agent)
    }
    const second = await startAgent(t.runtime, 'rev_agents', ['python3', 'whoami.py'], {
      workspaceDir: first.workspaceDir,
    })
    try {
      const d = (await reply(second.agent, 'look', 1)).trim().split(' ')
      // A fresh sandbox (its /tmp starts empty), the same workspace.
      expect(d.slice(3)).toEqual(['fresh', 'kept'])
      expect(second.agent.sandboxId).not.toBe(first.agent.sandboxId)
    } finally {
      await t.runtime.stopAgent(second.agent)
    }
  })
})

describe('jsonl protocol', () => {
  it('turns frames into events and completes on turn.done', async () => {
    const { agent } = await startAgent(t.runtime, 'rev_agents', ['python3', 'jsonl.py'], {
      protocol: 'jsonl',
    })
    try {
      for (const n of [1, 2]) {
        const { outcome, events } = await turn(agent, `hello ${n}\nsecond line`, n)
        expect(outcome).toMatchObject({ status: 'completed', text: `you said: hello ${n}\nsecond line` })
        expect(events).toEqual([
          { type: 'status', message: 'thinking' },
          { type: 'tool.start', id: 't1', name: 'list_files', input: { path: '.' } },
          { type: 'tool.end', id: 't1', output: ['a.txt'], isError: false },
          { type: 'metadata', data: { turn: n, turnId: `trn_t${n}` } },
          { type: 'text', content: 'you said: ' },
          { type: 'text', content: `hello ${n}\nsecond line` },
        ])
      }
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  it.each([
    ['a line that is not JSON', 'not json'],
    ['a frame that does not match its schema', 'bad frame'],
  ])('fails the turn with agent_protocol_error on %s', async (_name, prompt) => {
    const { agent } = await startAgent(t.runtime, 'rev_agents', ['python3', 'jsonl.py'], {
      protocol: 'jsonl',
    })
    try {
      expect((await turn(agent, 'fine', 1)).outcome.status).toBe('completed')
      const { outcome } = await turn(agent, prompt, 2)
      expect(outcome).toMatchObject({
        status: 'failed',
        code: 'agent_protocol_error',
        cause: 'protocol_error',
      })
      expect(agent.alive).toBe(false)
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  it('fails the turn with the message of an error frame', async () => {
    const { agent } = await startAgent(t.runtime, 'rev_agents', ['python3', 'jsonl.py'], {
      protocol: 'jsonl',
    })
    try {
      const { outcome } = await turn(agent, 'error', 1)
      expect(outcome).toMatchObject({ status: 'failed', code: 'agent_crashed', message: 'the tool exploded' })
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })
})

describe('exec protocol', () => {
  it('runs one process per turn with the message on stdin and completes on exit 0', async () => {
    const { agent, workspaceDir } = await startAgent(t.runtime, 'rev_agents', ['bash', 'exec.sh'], {
      protocol: 'exec',
    })
    try {
      const one = (await reply(agent, 'first message\nwith two lines', 1)).split('\n')
      expect(one.slice(0, 3)).toEqual(['exec got: first message', 'with two lines', 'runs: 2'])
      const two = (await reply(agent, 'second', 2)).split('\n')
      expect(two.slice(0, 2)).toEqual(['exec got: second', 'runs: 3'])
      // A fresh process (and sandbox) for every turn.
      expect(one[3]).toMatch(/^pid:\[\d+\]$/)
      expect(two[2]).toMatch(/^pid:\[\d+\]$/)
      expect(two[2]).not.toBe(one[3])
      expect(readFileSync(path.join(workspaceDir, 'runs.txt'), 'utf8')).toBe(
        'first message\nwith two lines\nsecond\n',
      )
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  it('receives a large reply whole when the process exits right after writing it', async () => {
    const { agent } = await startAgent(t.runtime, 'rev_agents', ['python3', '-c', 'print("x" * 2_000_000)'], {
      protocol: 'exec',
    })
    try {
      for (const n of [1, 2, 3]) expect((await reply(agent, '', n)).length).toBe(2_000_001)
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })

  it('fails a turn whose process exits nonzero with agent_crashed and the stderr tail', async () => {
    const { agent } = await startAgent(t.runtime, 'rev_agents', ['bash', 'exec.sh'], { protocol: 'exec' })
    try {
      const { outcome } = await turn(agent, 'fail now', 1)
      expect(outcome).toMatchObject({
        status: 'failed',
        code: 'agent_crashed',
        cause: 'agent_crash',
        text: 'partial\n',
      })
      if (outcome.status !== 'failed') return
      expect(outcome.message).toContain('exited with code 3')
      expect(outcome.message).toContain('fatal: cannot do fail now')
      expect(outcome.stderr).toBe('first stderr line\nfatal: cannot do fail now\n')
      // Each turn is its own process: the next one runs normally.
      expect((await reply(agent, 'recovered', 2)).split('\n')[0]).toBe('exec got: recovered')
    } finally {
      await t.runtime.stopAgent(agent)
    }
  })
})
