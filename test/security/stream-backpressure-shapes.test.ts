import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { makeProject } from '../helpers/projects.js'
import { Api, packDir } from '../helpers/server.js'
import { rssMiB, type ServerProcess, startServerProcess } from '../helpers/server-process.js'
import { FLOOD_RSS_GROWTH_BOUND_MIB, peakRss, slowTurn } from '../helpers/slow-client.js'

// The memory bound of stream-backpressure.test.ts for every shape an agent's output can take: each
// protocol, output that never ends a line or a frame, frames of several MiB. One server process
// (its resident memory is its own) runs the cases one after the other, 6 of ~8 s. A case's growth
// is counted from what the ones before left (the process keeps most of its high-water mark), so
// the cases that need the most come last; an unbounded flood grows by hundreds of MiB a case (the
// stdio agent that never reads its line: 369 MiB after the first case, before its cap).
const STALL_MS = 3000
const FLOOD_MS = 7000
/** How long after the flood a turn that went past a limit may take to end failed. */
const FAIL_BOUND_MS = 30_000
/**
 * How far above its start the server may be at any case's peak: what the cases before left (V8's
 * and the allocator's high-water marks, kept by the process: ~150 MiB measured after the 6 MiB
 * frames) and one case's bound.
 */
const FILE_RSS_GROWTH_BOUND_MIB = 2 * FLOOD_RSS_GROWTH_BOUND_MIB

/** `frame` as a Python expression: a jsonl tool frame whose input pads to `chars`. */
const toolFrame = (chars: string) =>
  `json.dumps({"type": "tool.start", "id": "t", "name": "flood", "input": {"pad": "x" * ${chars}}}) + "\\n"`

interface Shape {
  name: string
  files: Record<string, string>
  /** The turn's status once the flood is over: failed (the agent went past a limit), or still running. */
  status: 'failed' | 'running'
}

const SHAPES: Shape[] = [
  {
    name: 'a stdio agent printing lines as fast as it can',
    files: {
      'cairn.yaml': 'name: stdio-lines\ncommand: python3 a.py\n',
      'a.py': 'import sys\ninput()\nwhile True:\n    sys.stdout.write("x" * 4000 + "\\n")\n',
    },
    status: 'failed',
  },
  {
    name: 'a stdio agent printing without ever reading its line',
    files: {
      'cairn.yaml': 'name: stdio-deaf\ncommand: python3 a.py\n',
      'a.py': 'import sys\nwhile True:\n    sys.stdout.write("x" * 4000 + "\\n")\n',
    },
    status: 'failed',
  },
  {
    name: 'an exec agent writing one line that never ends',
    files: {
      'cairn.yaml': 'name: exec-line\ncommand: python3 a.py\nprotocol: exec\n',
      'a.py': 'import sys\nwhile True:\n    sys.stdout.write("x" * 4000)\n    sys.stdout.flush()\n',
    },
    status: 'failed',
  },
  {
    name: 'an http agent answering tool frames as fast as it can',
    files: {
      'cairn.yaml': 'name: http-flood\ncommand: python3 a.py\nprotocol: http\nhttp: { port: 8080 }\n',
      'a.py': [
        'import json, os',
        'from http.server import BaseHTTPRequestHandler, HTTPServer',
        `chunk = (${toolFrame('4000')}).encode() * 50`,
        'class Agent(BaseHTTPRequestHandler):',
        '    def do_POST(self):',
        '        self.rfile.read(int(self.headers["Content-Length"]))',
        '        self.send_response(200)',
        '        self.send_header("Content-Type", "application/x-ndjson")',
        '        self.end_headers()',
        '        while True:',
        '            self.wfile.write(chunk)',
        'HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Agent).serve_forever()',
      ].join('\n'),
    },
    status: 'running',
  },
  {
    name: 'a jsonl agent writing one frame that never ends',
    files: {
      'cairn.yaml': 'name: jsonl-line\ncommand: python3 a.py\nprotocol: jsonl\n',
      'a.py':
        'import sys\nsys.stdin.readline()\nsys.stdout.write(\'{"type": "text", "content": "\')\nwhile True:\n    sys.stdout.write("x" * 4000)\n',
    },
    status: 'failed',
  },
  {
    name: 'a jsonl agent writing one frame of 6 MiB, then frames as fast as it can',
    files: {
      'cairn.yaml': 'name: jsonl-huge\ncommand: python3 a.py\nprotocol: jsonl\n',
      'a.py': [
        'import json, sys',
        `huge = ${toolFrame('(6 << 20)')}`,
        `chunk = (${toolFrame('4000')}) * 50`,
        'sys.stdin.readline()',
        'sys.stdout.write(huge)',
        'while True:',
        '    sys.stdout.write(chunk)',
      ].join('\n'),
    },
    status: 'running',
  },
]

let server: ServerProcess
let api: Api
/** The server's resident memory before the first case, in MiB. */
let start: number

beforeAll(async () => {
  server = await startServerProcess({ spareLaunchers: 0, sseStallMs: STALL_MS })
  api = new Api(server.url, server.key)
  for (const { files } of SHAPES)
    expect((await api.call('POST', '/v1/agents', await packDir(await makeProject(files)))).status).toBe(201)
  start = rssMiB(server.child.pid ?? 0)
}, 180_000)

afterAll(async () => {
  await server?.stop()
})

/**
 * The session's turn once the flood is over. A turn that must fail gets up to FAIL_BOUND_MS more:
 * its limit is met at the pace the slow client drains it, later on a loaded machine (an exec line
 * still running at 7 s under load 15); one that must keep running is read at once.
 */
async function turnAfterFlood(sessionId: string, status: Shape['status']) {
  const deadline = Date.now() + (status === 'failed' ? FAIL_BOUND_MS : 0)
  for (;;) {
    const turn = (await api.call('GET', `/v1/sessions/${sessionId}/turns`)).body.data?.[0]
    if (turn?.status !== 'running' || Date.now() >= deadline) return turn
    await new Promise((resolve) => setTimeout(resolve, 200))
  }
}

describe('every shape of an agent flood leaves the server within its memory bound', () => {
  it.each(SHAPES)('$name', async ({ files, status }) => {
    const name = /name: (\S+)/.exec(files['cairn.yaml'] ?? '')?.[1] ?? ''
    const session = await api.createSession(name)
    const pid = server.child.pid ?? 0
    const before = rssMiB(pid)
    const client = slowTurn(server, session.id, 40 * 1024)
    try {
      const [peak = 0] = await peakRss(pid, FLOOD_MS)
      const growth = peak - before
      console.log(
        `${name}: server RSS ${before.toFixed(0)} MiB before, grew by ${growth.toFixed(0)} MiB at most`,
      )
      expect(growth, `the server grew by ${growth.toFixed(0)} MiB`).toBeLessThan(FLOOD_RSS_GROWTH_BOUND_MIB)
      expect(peak - start, `the server is ${(peak - start).toFixed(0)} MiB above its start`).toBeLessThan(
        FILE_RSS_GROWTH_BOUND_MIB,
      )
      expect(client.received).toBeGreaterThan(0)
      const turn = await turnAfterFlood(session.id, status)
      expect(turn?.status, JSON.stringify({ ...turn, response: turn?.response.slice(0, 200) })).toBe(status)
    } finally {
      client.stop()
      expect((await api.call('POST', `/v1/sessions/${session.id}/cancel`)).status).toBe(200)
    }
  })
})
