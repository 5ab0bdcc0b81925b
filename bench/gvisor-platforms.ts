import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { runscTrue } from './gvisor-start.js'
import { type Bench, progress, repeat, timedResult } from './lib/bench.js'
import { runscRestoreFloor } from './lib/runsc-floors.js'
import { type BenchServer, EXAMPLES, startBenchServer } from './lib/server.js'
import { type Row, row } from './lib/stats.js'

const RUNS = Number(process.env.BENCH_PLATFORM_RUNS ?? 6)
const FLOOR_RUNS = 8
const KEEP_WARM_MS = 200

const CASES = [
  { name: 'echo', prompt: 'hello', expect: 'hello\n' },
  { name: 'notes', prompt: 'The bench ran', expect: 'Noted: The bench ran\n' },
] as const

interface Config {
  label: string
  path: string
  platform: string
}

/**
 * The runsc releases and platforms compared: the installed runsc (20240729 from bookworm-backports
 * where the set-up scripts ran) on systrap and on ptrace, and, when BENCH_RUNSC_BEFORE names Debian
 * 12's own runsc 20221219 (`apt-get download runsc=0.0~20221219.0-2+b3`, then `dpkg-deb -x`), that
 * release on ptrace, its only working platform here.
 */
function configs(): Config[] {
  const installed = process.env.CAIRN_RUNSC ?? 'runsc'
  const before = process.env.BENCH_RUNSC_BEFORE
  return [
    ...(before ? [{ label: 'before: 20221219 ptrace', path: before, platform: 'ptrace' }] : []),
    { label: 'after: installed ptrace', path: installed, platform: 'ptrace' },
    { label: 'after: installed systrap', path: installed, platform: 'systrap' },
  ]
}

interface Sample {
  coldMs: number
  warmMs: number
  checkpointMs: number
  checkpointMiB: number
  restoredMs: number
}

/** The `memory_paused` event of a session (the checkpoint is taken when keep-warm ends). */
async function pausedDetail(server: BenchServer, id: string): Promise<string> {
  for (let i = 0; i < 1500; i++) {
    const res = await server.http.json('GET', `/v1/sessions/${id}/events`)
    const found = (res.body.data as { cause: string; detail: string | null }[]).find(
      (e) => e.cause === 'memory_paused',
    )
    if (found) return found.detail ?? ''
    await new Promise((r) => setTimeout(r, 20))
  }
  throw new Error(`no memory_paused event for ${id}`)
}

/** One session: cold first message, a warm second, its checkpoint, a restored third (POST -> first byte). */
async function once(server: BenchServer, c: (typeof CASES)[number], problems: string[]) {
  const session = await server.createSession(c.name, { keepWarmMs: KEEP_WARM_MS, autoSnapshots: false })
  try {
    const route = `/v1/sessions/${session.id}/messages`
    const cold = await server.http.stream(route, { prompt: c.prompt })
    const warm = await server.http.stream(route, { prompt: c.prompt })
    const detail = await pausedDetail(server, session.id)
    const restored = await server.http.stream(route, { prompt: c.prompt })
    const figures = /checkpoint of (\d+) bytes in (\d+) ms/.exec(detail)
    const runs = [cold, warm, restored]
    if (
      runs.some(
        (t) => t.terminal !== 'run.completed' || t.firstDeltaMs === undefined || t.text !== c.expect,
      ) ||
      !cold.coldStart ||
      warm.coldStart ||
      restored.coldStart ||
      !figures
    ) {
      problems.push(`${c.name}: ${runs.map((t) => `${t.terminal} ${JSON.stringify(t.text)}`).join(', ')}`)
      return undefined
    }
    return {
      coldMs: cold.firstDeltaMs ?? 0,
      warmMs: warm.firstDeltaMs ?? 0,
      checkpointMs: Number(figures[2]),
      checkpointMiB: Number(figures[1]) / 1024 / 1024,
      restoredMs: restored.firstDeltaMs ?? 0,
    }
  } finally {
    await server.deleteSession(session.id)
  }
}

/** Every figure of one runsc release and platform, each beside its floor measured in the same run. */
async function measure(config: Config, problems: string[]): Promise<Row[]> {
  const env = { runsc: process.env.CAIRN_RUNSC, platform: process.env.CAIRN_GVISOR_PLATFORM }
  // The runtime reads both when it is made: each server runs the release and platform under test.
  process.env.CAIRN_RUNSC = config.path
  process.env.CAIRN_GVISOR_PLATFORM = config.platform
  const server = await startBenchServer({ server: { gvisorPoolSize: 0, residentPauses: 0 } }).finally(() => {
    for (const [name, value] of [
      ['CAIRN_RUNSC', env.runsc],
      ['CAIRN_GVISOR_PLATFORM', env.platform],
    ] as const) {
      if (value === undefined) delete process.env[name]
      else process.env[name] = value
    }
  })
  const rows: Row[] = []
  try {
    for (const c of CASES) {
      const dir = await pausing(`${EXAMPLES}/${c.name}`)
      await server.deploy(dir)
      await rm(dir, { recursive: true, force: true })
    }
    for (const c of CASES) await once(server, c, problems)
    progress(`${config.label}: floors`)
    const boot = row(
      `${config.label}: runsc do /bin/true`,
      await samplesOf(FLOOR_RUNS, () => runscTrue(config)),
    )
    const restore = row(`${config.label}: runsc restore alone`, await runscRestoreFloor(config, FLOOR_RUNS))
    const health = row(
      `${config.label}: GET /healthz`,
      await samplesOf(20, async () => (await server.http.json('GET', '/healthz')).ms),
    )
    rows.push(boot, restore, health)
    const floorOf = (r: Row) => ({ name: r.name.split(': ').slice(1).join(': '), median: r.summary.median })
    progress(`${config.label}: ${RUNS} sessions per agent`)
    const samples = new Map<string, Sample[]>(CASES.map((c) => [c.name, []]))
    await repeat(RUNS, 240_000, async () => {
      for (const c of CASES) {
        const s = await once(server, c, problems)
        if (s) samples.get(c.name)?.push(s)
      }
    })
    for (const c of CASES) {
      const s = samples.get(c.name) ?? []
      const name = `${config.label}, ${c.name}`
      rows.push(
        row(
          `${name}: cold start, message -> first byte`,
          s.map((x) => x.coldMs),
          floorOf(boot),
        ),
        row(
          `${name}: warm turn, message -> first byte`,
          s.map((x) => x.warmMs),
          floorOf(health),
        ),
        row(
          `${name}: checkpoint (server's figure)`,
          s.map((x) => x.checkpointMs),
        ),
        {
          ...row(
            `${name}: checkpoint size`,
            s.map((x) => x.checkpointMiB),
          ),
          unit: 'MiB',
        },
        row(
          `${name}: restored, message -> first byte`,
          s.map((x) => x.restoredMs),
          floorOf(restore),
        ),
      )
    }
  } finally {
    await server.close()
  }
  return rows
}

async function samplesOf(n: number, fn: () => Promise<number>): Promise<number[]> {
  const out: number[] = []
  for (let i = 0; i < n; i++) out.push(await fn())
  return out
}

/** A copy of the example with `isolation: gvisor` and `pause: memory`. */
async function pausing(exampleDir: string): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), 'cairn-bench-platform-'))
  await cp(exampleDir, dir, { recursive: true })
  const manifest = await readFile(path.join(dir, 'cairn.yaml'), 'utf8')
  await writeFile(path.join(dir, 'cairn.yaml'), `${manifest}isolation: gvisor\npause: memory\n`)
  return dir
}

/**
 * gVisor's releases and platforms side by side (issue 31): per configuration one server (pool off:
 * sandboxes that may be checkpointed boot on demand) and, per agent and run, a new session's cold
 * first message, a warm second one, the checkpoint taken when keep-warm ends and a restored third;
 * beside `runsc do /bin/true`, `runsc restore` alone and `GET /healthz` measured in the same run.
 */
export const gvisorPlatforms: Bench = {
  name: 'gvisor-platforms',
  description:
    'gVisor 20221219 ptrace vs 20240729 ptrace and systrap: cold start, warm turn, checkpoint, restore',
  run: () =>
    timedResult('gvisor-platforms', async () => {
      const problems: string[] = []
      const rows: Row[] = []
      const list = configs()
      for (const config of list) rows.push(...(await measure(config, problems)))
      if (problems.length > 0)
        throw new Error(`gvisor-platforms failed:\n${problems.slice(0, 10).join('\n')}`)
      return {
        config: {
          runs: RUNS,
          keepWarmMs: KEEP_WARM_MS,
          configurations: list,
          measured:
            'per configuration one server (gVisor pool off); per run and agent a new session (autoSnapshots off, pause: memory): message POST -> first message.delta cold, then warm, the checkpoint when keep-warm ends (the memory_paused event), then restored; floors in the same run: runsc do /bin/true, runsc restore --detach of a checkpointed sleep (image in page cache), GET /healthz',
        },
        rows,
        targets: [],
        notes: [],
      }
    }),
}
