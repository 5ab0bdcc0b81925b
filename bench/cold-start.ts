import { floor } from './baselines.js'
import { type Bench, progress, repeat } from './lib/bench.js'
import { machineInfo } from './lib/machine.js'
import type { BenchResult, Target } from './lib/results.js'
import { EXAMPLES, startBenchServer } from './lib/server.js'
import { type Row, row } from './lib/stats.js'

const RUNS = 50
const WARMUP = 3

interface AgentCase {
  name: 'echo' | 'notes'
  prompt: string
  expect: string
  /** The agent's interpreter started in an empty sandbox: the floor of a cold start. */
  sandboxFloor: 'bwrap bash -c :' | 'bwrap python3 -c 0'
  /** The agent's own start-up outside any sandbox. */
  startup: 'bash -c :' | 'python3 -c 0'
}

const CASES: AgentCase[] = [
  { name: 'echo', prompt: 'hello', expect: 'hello\n', sandboxFloor: 'bwrap bash -c :', startup: 'bash -c :' },
  {
    name: 'notes',
    prompt: 'The bench ran',
    expect: 'Noted: The bench ran\n',
    sandboxFloor: 'bwrap python3 -c 0',
    startup: 'python3 -c 0',
  },
]

/**
 * A new session and its first message: from the create request to the first `message.delta`
 * byte, and from the message POST to it. Each session is deleted (untimed) after its run, so
 * every run starts a fresh sandbox and no warm agents pile up.
 */
export const coldStart: Bench = {
  name: 'cold-start',
  description: 'new session to first byte of the first reply (echo, notes)',
  async run(): Promise<BenchResult> {
    const startedAt = new Date().toISOString()
    const t0 = performance.now()
    const floors = new Map<string, { name: string; median: number }>()
    for (const c of CASES)
      for (const name of [c.sandboxFloor, c.startup] as const) floors.set(name, await floor(name))
    const server = await startBenchServer()
    try {
      for (const c of CASES) await server.deploy(`${EXAMPLES}/${c.name}`)
      const samples = new Map<
        string,
        { create: number[]; total: number[]; post: number[]; started: number[]; resume: number[] }
      >(CASES.map((c) => [c.name, { create: [], total: [], post: [], started: [], resume: [] }]))
      const problems: string[] = []
      const once = async (c: AgentCase, keep: boolean) => {
        const a = performance.now()
        const session = await server.createSession(c.name)
        const b = performance.now()
        const t = await server.http.stream(`/v1/sessions/${session.id}/messages`, { prompt: c.prompt })
        if (t.terminal !== 'run.completed' || t.firstDeltaMs === undefined || t.runStartedMs === undefined) {
          problems.push(`${c.name}: ${t.status} ${t.terminal} ${t.error ?? ''}`)
        } else if (keep) {
          if (t.text !== c.expect) problems.push(`${c.name}: unexpected reply ${JSON.stringify(t.text)}`)
          if (t.coldStart !== true) problems.push(`${c.name}: run.started said coldStart=${t.coldStart}`)
          const s = samples.get(c.name)
          s?.create.push(session.ms)
          s?.total.push(b - a + t.firstDeltaMs)
          s?.post.push(t.firstDeltaMs)
          s?.started.push(t.runStartedMs)
        }
        // Resume: the session ended (sandbox stopped, untimed), then a message on a fresh sandbox.
        const ended = await server.http.json('POST', `/v1/sessions/${session.id}/end`)
        if (ended.status !== 200) problems.push(`${c.name}: end answered ${ended.status}`)
        const r = await server.http.stream(`/v1/sessions/${session.id}/messages`, { prompt: c.prompt })
        if (r.terminal !== 'run.completed' || r.firstDeltaMs === undefined) {
          problems.push(`${c.name} resume: ${r.status} ${r.terminal} ${r.error ?? ''}`)
        } else if (keep) {
          if (r.coldStart !== true)
            problems.push(`${c.name} resume: run.started said coldStart=${r.coldStart}`)
          samples.get(c.name)?.resume.push(r.firstDeltaMs)
        }
        await server.deleteSession(session.id)
      }
      for (let i = 0; i < WARMUP; i++) for (const c of CASES) await once(c, false)
      progress(`${RUNS} cold starts per agent, alternating (node:http keep-alive)`)
      const { truncated } = await repeat(RUNS, 120_000, async () => {
        for (const c of CASES) await once(c, true)
      })
      if (problems.length > 0) throw new Error(`cold-start runs failed:\n${problems.slice(0, 10).join('\n')}`)

      const rows: Row[] = []
      const targets: Target[] = []
      const notes: string[] = []
      for (const c of CASES) {
        const s = samples.get(c.name) as {
          create: number[]
          total: number[]
          post: number[]
          started: number[]
          resume: number[]
        }
        const sandboxFloor = floors.get(c.sandboxFloor) as { name: string; median: number }
        const startup = floors.get(c.startup) as { name: string; median: number }
        const total = row(`${c.name}: create -> first byte`, s.total, sandboxFloor)
        rows.push(
          total,
          row(`${c.name}: message POST -> first byte`, s.post, sandboxFloor),
          row(`${c.name}: message POST -> run.started`, s.started),
          row(`${c.name}: POST /v1/sessions`, s.create),
        )
        const resume = row(
          `${c.name}: resume (ended session) message POST -> first byte`,
          s.resume,
          sandboxFloor,
        )
        rows.push(resume)
        const overhead = total.summary.median - startup.median
        notes.push(
          `${c.name}: cold start minus the agent's own start-up (${c.startup}, ${startup.median.toFixed(1)} ms) = ${overhead.toFixed(1)} ms`,
        )
        targets.push({
          name: `${c.name} cold start (issue 2)`,
          goal: `median < 50 ms + agent start-up (${c.startup} ${startup.median.toFixed(1)} ms)`,
          value: total.summary.median,
          met: overhead < 50,
        })
        if (c.name === 'echo') {
          targets.push({
            name: 'echo cold start (issue 9)',
            goal: 'median < 30 ms',
            value: total.summary.median,
            met: total.summary.median < 30,
          })
          targets.push({
            name: 'echo resume of a stopped session (issue 9)',
            goal: 'median < 30 ms',
            value: resume.summary.median,
            met: resume.summary.median < 30,
          })
        }
      }
      return {
        bench: 'cold-start',
        startedAt,
        durationMs: performance.now() - t0,
        machine: machineInfo(),
        config: {
          runs: RUNS,
          warmup: WARMUP,
          client: 'node:http keep-alive',
          measured:
            'create -> first byte: from the POST /v1/sessions request to the arrival of the first message.delta of the first message; message POST -> first byte: from the message POST; resume: the session ended (untimed, its sandbox stopped), then from a second message POST to its first message.delta (a fresh sandbox on the same workspace); each session deleted (untimed) after its run',
          truncated,
        },
        rows,
        targets,
        notes,
      }
    } finally {
      await server.close()
    }
  },
}
