import { spawn } from 'node:child_process'
import { cp, mkdir, mkdtemp, readFile, rm, rmdir, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import type { GvisorDriver } from '../packages/runtime/dist/index.js'
import { runscTrue } from './gvisor-start.js'
import { type Bench, progress, repeat } from './lib/bench.js'
import { machineInfo } from './lib/machine.js'
import type { BenchResult } from './lib/results.js'
import { type BenchServer, EXAMPLES, startBenchServer } from './lib/server.js'
import { type Row, row } from './lib/stats.js'

const RUNS = Number(process.env.BENCH_PAUSE_RUNS ?? 8)
const KEEP_WARM_MS = 200

/** A Node stdio agent holding a 100 MiB JS heap besides its reply loop. */
const NODE_HEAP_AGENT = `// 100 arrays of 131,072 random doubles (1 MiB each, unboxed, incompressible): a 100 MiB JS heap.
const heap = Array.from({ length: 100 }, () => Array.from({ length: 131072 }, () => Math.random()))
const rl = require('node:readline').createInterface({ input: process.stdin })
rl.on('line', (line) => console.log(\`heap \${heap.length} MiB: \${line}\`))
`

const CASES = [
  { name: 'echo', prompt: 'hello', expect: 'hello\n', restores: true },
  { name: 'notes', prompt: 'The bench ran', expect: 'Noted: The bench ran\n', restores: true },
  { name: 'node-heap', prompt: 'hello', expect: 'heap 100 MiB: hello\n', restores: true },
] as const

const DRIVERS = ['bwrap', 'gvisor'] as const
type Driver = (typeof DRIVERS)[number]

/** The example (or the Node heap agent) as an agent of `driver` with `pause: memory`, named `<name>-<driver>`. */
async function pausingProject(name: (typeof CASES)[number]['name'], driver: Driver): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), `cairn-bench-pause-${name}-`))
  if (name === 'node-heap') {
    await writeFile(path.join(dir, 'agent.js'), NODE_HEAP_AGENT)
    await writeFile(
      path.join(dir, 'cairn.yaml'),
      'name: node-heap\ncommand: node agent.js\nprotocol: stdio\nlimits:\n  memoryMiB: 512\n',
    )
  } else {
    await cp(path.join(EXAMPLES, name), dir, { recursive: true })
  }
  const manifest = (await readFile(path.join(dir, 'cairn.yaml'), 'utf8')).replace(
    /^name: .*$/m,
    `name: ${name}-${driver}`,
  )
  await writeFile(path.join(dir, 'cairn.yaml'), `${manifest}isolation: ${driver}\npause: memory\n`)
  return dir
}

interface Sample {
  coldFirstByteMs: number
  /** The pause's own figure: the freeze (resident) or `runsc checkpoint` (checkpoint), ms. */
  pauseMs: number
  checkpointBytes: number | undefined
  resumeFirstByteMs: number
  /** The next message at once, the sandbox warm: what a resident resume adds a thaw to. */
  warmFirstByteMs: number
}

/** The `n`th event of `cause` in the session's events (the pause is taken in the background). */
async function waitForEvent(server: BenchServer, id: string, cause: string, n = 1) {
  for (let i = 0; i < 1500; i++) {
    const res = await server.http.json('GET', `/v1/sessions/${id}/events`)
    const found = (res.body.data as { cause: string; detail: string | null }[]).filter(
      (e) => e.cause === cause,
    )
    if (found.length >= n) return found[n - 1]
    await new Promise((r) => setTimeout(r, 20))
  }
  throw new Error(`no ${cause} event for ${id}`)
}

/** A message POST to its first byte, or undefined (with the problem) when it did not complete as `cold`. */
async function message(
  server: BenchServer,
  id: string,
  c: (typeof CASES)[number],
  cold: boolean,
  problems: string[],
) {
  const sent = await server.http.stream(`/v1/sessions/${id}/messages`, { prompt: c.prompt })
  if (sent.terminal !== 'run.completed' || sent.firstDeltaMs === undefined || sent.coldStart !== cold) {
    problems.push(
      `${c.name}: ${sent.status} ${sent.terminal} cold=${sent.coldStart} ${sent.error ?? ''} ${JSON.stringify(sent.text)}`,
    )
    return undefined
  }
  if (sent.text !== c.expect) problems.push(`${c.name}: reply ${JSON.stringify(sent.text)}`)
  return sent.firstDeltaMs
}

/**
 * One session: a cold first message, its pause when keep-warm ends (frozen in place, or
 * checkpointed where resident pauses are off), the next message (thawed or restored), and one
 * more at once while it is warm.
 */
async function once(
  server: BenchServer,
  c: (typeof CASES)[number],
  driver: Driver,
  problems: string[],
): Promise<Sample | undefined> {
  const session = await server.createSession(`${c.name}-${driver}`, {
    keepWarmMs: KEEP_WARM_MS,
    autoSnapshots: false,
  })
  try {
    const coldFirstByteMs = await message(server, session.id, c, true, problems)
    if (coldFirstByteMs === undefined) return undefined
    const paused = await waitForEvent(server, session.id, 'memory_paused')
    const checkpoint = /checkpoint of (\d+) bytes in (\d+) ms/.exec(paused?.detail ?? '')
    const frozen = /frozen in place in (\d+) ms/.exec(paused?.detail ?? '')
    const resumeFirstByteMs = await message(server, session.id, c, false, problems)
    const warmFirstByteMs = await message(server, session.id, c, false, problems)
    if (resumeFirstByteMs === undefined || warmFirstByteMs === undefined) return undefined
    return {
      coldFirstByteMs,
      pauseMs: Number(checkpoint?.[2] ?? frozen?.[1]),
      checkpointBytes: checkpoint ? Number(checkpoint[1]) : undefined,
      resumeFirstByteMs,
      warmFirstByteMs,
    }
  } finally {
    await server.deleteSession(session.id)
  }
}

/** The tiers, each on a server of its own, both up at once so their runs interleave. */
const TIERS = [
  { label: 'resident', drivers: DRIVERS, server: { residentPauses: 16, residentPauseMs: 600_000 } },
  { label: 'checkpoint', drivers: ['gvisor'] as const, server: { residentPauses: 0 } },
] as const

/**
 * The floor of a resident resume: a process frozen in a cgroup of its own (cgroup v2), thawed,
 * and a line through it — the write of `cgroup.freeze` to the line coming back — with nothing else.
 */
async function thawFloorMs(): Promise<number> {
  const mounts = await readFile('/proc/mounts', 'utf8')
  const v2 = /^cgroup2 (\S+) cgroup2 /m.exec(mounts)?.[1]
  if (!v2) throw new Error('no cgroup v2 hierarchy mounted: the thaw floor needs cgroup.freeze')
  const dir = path.join(v2, `cairn-bench-thaw-${process.pid}`)
  await mkdir(dir)
  const child = spawn('sh', ['-c', 'while read l; do echo "$l"; done'], { stdio: ['pipe', 'pipe', 'ignore'] })
  try {
    await writeFile(path.join(dir, 'cgroup.procs'), String(child.pid))
    await writeFile(path.join(dir, 'cgroup.freeze'), '1')
    while (!(await readFile(path.join(dir, 'cgroup.events'), 'utf8')).includes('frozen 1'))
      await new Promise((r) => setTimeout(r, 1))
    const echoed = new Promise((r) => child.stdout.once('data', r))
    const t0 = performance.now()
    await writeFile(path.join(dir, 'cgroup.freeze'), '0')
    child.stdin.write('x\n')
    await echoed
    return performance.now() - t0
  } finally {
    child.kill('SIGKILL')
    await new Promise((r) => child.once('exit', r))
    await rmdir(dir)
  }
}

/** Both tiers' figures, runs interleaved: per run each tier's servers take every agent in turn. */
async function measure(rows: Row[], problems: string[]): Promise<string> {
  const servers = await Promise.all(
    TIERS.map((tier) => startBenchServer({ server: { gvisorPoolSize: 0, ...tier.server } })),
  )
  let platform = ''
  try {
    for (const [i, tier] of TIERS.entries()) {
      const server = servers[i] as BenchServer
      for (const c of CASES)
        for (const driver of tier.drivers) {
          const dir = await pausingProject(c.name, driver)
          await server.deploy(dir)
          await rm(dir, { recursive: true, force: true })
        }
      // One untimed cycle of each: images in the page cache, runsc's first start behind us.
      for (const c of CASES) for (const driver of tier.drivers) await once(server, c, driver, problems)
    }
    const runsc = ((servers[0] as BenchServer).server.runtime.drivers.gvisor as GvisorDriver).runsc
    platform = runsc.platform
    const floors = { runsc: [] as number[], thaw: [] as number[] }
    const samples = new Map<string, Sample[]>()
    progress(`${RUNS} pause/resume cycles per agent, driver and tier`)
    await repeat(RUNS, 600_000, async () => {
      floors.runsc.push(await runscTrue(runsc))
      floors.thaw.push(await thawFloorMs())
      for (const c of CASES)
        for (const [i, tier] of TIERS.entries())
          for (const driver of tier.drivers) {
            const s = await once(servers[i] as BenchServer, c, driver, problems)
            const key = `${tier.label}: ${c.name} (${driver})`
            if (s) samples.set(key, [...(samples.get(key) ?? []), s])
          }
    })
    const thaw = {
      name: 'thaw of a frozen cgroup, a line through it',
      median: row('', floors.thaw).summary.median,
    }
    const runscFloor = {
      name: `runsc do /bin/true (${platform})`,
      median: row('', floors.runsc).summary.median,
    }
    rows.push(row(thaw.name, floors.thaw), row(runscFloor.name, floors.runsc))
    for (const [key, s] of samples) {
      const resident = key.startsWith('resident')
      rows.push(
        row(
          `${key}: cold start, message -> first byte`,
          s.map((x) => x.coldFirstByteMs),
        ),
        row(
          `${key}: warm, message -> first byte`,
          s.map((x) => x.warmFirstByteMs),
          thaw,
        ),
        row(
          `${key}: ${resident ? 'thawed' : 'restored'}, message -> first byte`,
          s.map((x) => x.resumeFirstByteMs),
          resident ? thaw : runscFloor,
        ),
        row(
          `${key}: ${resident ? 'freeze' : 'checkpoint'} (server's figure)`,
          s.map((x) => x.pauseMs),
        ),
        ...(resident
          ? []
          : [
              row(
                `${key}: checkpoint size (MiB, not ms)`,
                s.map((x) => (x.checkpointBytes ?? 0) / 1024 / 1024),
              ),
            ]),
      )
    }
  } finally {
    await Promise.all(servers.map((s) => s.close()))
  }
  return platform
}

/**
 * `pause: memory` on both tiers: per agent and driver, a new session's first message (cold, POST
 * to first byte), the pause when keep-warm ends (a freeze in place, or under gVisor with resident
 * pauses off a checkpoint: its time and size), the next message (thawed or restored, POST to
 * first byte) and one more while warm.
 */
export const pause: Bench = {
  name: 'pause',
  description:
    'pause: memory, resident (bwrap, gVisor) vs checkpoint (gVisor): resume to first byte beside a thaw and a runsc start',
  async run(): Promise<BenchResult> {
    const startedAt = new Date().toISOString()
    const t0 = performance.now()
    const rows: Row[] = []
    const notes: string[] = []
    const problems: string[] = []
    const platform = await measure(rows, problems)
    if (problems.length > 0) throw new Error(`pause runs failed:\n${problems.slice(0, 10).join('\n')}`)
    notes.push('checkpoint size rows are MiB per checkpoint, in the time columns')
    return {
      bench: 'pause',
      startedAt,
      durationMs: performance.now() - t0,
      machine: machineInfo(),
      config: {
        runs: RUNS,
        keepWarmMs: KEEP_WARM_MS,
        platform,
        measured:
          'two servers up at once, runs interleaved: resident pauses on (bwrap and gVisor agents: frozen in place when keep-warm ends, thawed by the next message) and off (gVisor agents: checkpointed when keep-warm ends, restored into the target booted while paused); per run and agent a new session (autoSnapshots off): first message POST -> first message.delta (cold), the pause (memory_paused: freeze or runsc checkpoint time, image bytes), the second message POST -> first message.delta (thawed / restored), a third at once (warm); the session deleted, untimed. Floors per run: a frozen cgroup thawed and a line echoed through its process; runsc do /bin/true',
      },
      rows,
      targets: [],
      notes,
    }
  },
}
