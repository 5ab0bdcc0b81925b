import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
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

/** The example (or the Node heap agent) as a gVisor agent with `pause: memory`. */
async function pausingProject(name: (typeof CASES)[number]['name']): Promise<string> {
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
  const manifest = await readFile(path.join(dir, 'cairn.yaml'), 'utf8')
  await writeFile(path.join(dir, 'cairn.yaml'), `${manifest}isolation: gvisor\npause: memory\n`)
  return dir
}

interface Sample {
  coldFirstByteMs: number
  checkpointMs: number
  checkpointBytes: number
  restoreFirstByteMs: number | undefined
}

/** The `n`th event of `cause` in the session's events (the checkpoint is taken in the background). */
async function waitForEvent(server: BenchServer, id: string, cause: string, n = 1) {
  for (let i = 0; i < 600; i++) {
    const res = await server.http.json('GET', `/v1/sessions/${id}/events`)
    const found = (res.body.data as { cause: string; detail: string | null }[]).filter(
      (e) => e.cause === cause,
    )
    if (found.length >= n) return found[n - 1]
    await new Promise((r) => setTimeout(r, 20))
  }
  throw new Error(`no ${cause} event for ${id}`)
}

/** One session: a cold first message, its checkpoint when keep-warm ends, a restored second message. */
async function once(
  server: BenchServer,
  c: (typeof CASES)[number],
  problems: string[],
): Promise<Sample | undefined> {
  const session = await server.createSession(c.name, { keepWarmMs: KEEP_WARM_MS, autoSnapshots: false })
  try {
    const route = `/v1/sessions/${session.id}/messages`
    const cold = await server.http.stream(route, { prompt: c.prompt })
    if (cold.terminal !== 'run.completed' || cold.firstDeltaMs === undefined || !cold.coldStart) {
      problems.push(
        `${c.name} cold: ${cold.status} ${cold.terminal} ${cold.error ?? ''} ${JSON.stringify(cold.text)}`,
      )
      return undefined
    }
    const paused = await waitForEvent(server, session.id, 'memory_paused')
    const figures = /checkpoint of (\d+) bytes in (\d+) ms/.exec(paused?.detail ?? '')
    const checkpoint = { checkpointMs: Number(figures?.[2]), checkpointBytes: Number(figures?.[1]) }
    if (!c.restores) {
      if (cold.text !== c.expect) problems.push(`${c.name}: reply ${JSON.stringify(cold.text)}`)
      return { coldFirstByteMs: cold.firstDeltaMs, ...checkpoint, restoreFirstByteMs: undefined }
    }
    const restored = await server.http.stream(route, { prompt: c.prompt })
    if (restored.terminal !== 'run.completed' || restored.firstDeltaMs === undefined || restored.coldStart) {
      problems.push(
        `${c.name} restore: ${restored.terminal} cold=${restored.coldStart} ${JSON.stringify(restored.text)}`,
      )
      return undefined
    }
    if (cold.text !== c.expect || restored.text !== c.expect)
      problems.push(`${c.name}: replies ${JSON.stringify([cold.text, restored.text])}`)
    return {
      coldFirstByteMs: cold.firstDeltaMs,
      ...checkpoint,
      restoreFirstByteMs: restored.firstDeltaMs,
    }
  } finally {
    await server.deleteSession(session.id)
  }
}

/** The ways a restore is measured: booting its sandbox, and into a target booted while paused. */
const MODES = [
  { label: 'boot at restore', targets: '0' },
  { label: 'pre-started target', targets: undefined },
] as const

/** One server's figures (rows named after `label`); returns the gVisor platform it ran on. */
async function measure(label: string, rows: Row[], problems: string[]): Promise<string> {
  // On-demand sandboxes: a restore runs the image in a sandbox of the cold layout.
  const server = await startBenchServer({ server: { gvisorPoolSize: 0 } })
  let platform = ''
  try {
    const driver = server.server.runtime.drivers.gvisor as GvisorDriver
    for (const c of CASES) {
      const dir = await pausingProject(c.name)
      await server.deploy(dir)
      await rm(dir, { recursive: true, force: true })
    }
    for (const c of CASES) await once(server, c, problems)
    platform = driver.runsc.platform
    const floorSamples: number[] = []
    for (let i = 0; i < 10; i++) floorSamples.push(await runscTrue(driver.runsc))
    const floor = {
      name: `${label}: runsc do /bin/true (${platform})`,
      median: row('', floorSamples).summary.median,
    }
    rows.push(row(floor.name, floorSamples))
    progress(`${label}: ${RUNS} pause/restore cycles per agent`)
    const samples = new Map<string, Sample[]>(CASES.map((c) => [c.name, []]))
    await repeat(RUNS, 300_000, async () => {
      for (const c of CASES) {
        const s = await once(server, c, problems)
        if (s) samples.get(c.name)?.push(s)
      }
    })
    for (const c of CASES) {
      const s = samples.get(c.name) ?? []
      rows.push(
        row(
          `${label}: ${c.name}: cold start, message -> first byte`,
          s.map((x) => x.coldFirstByteMs),
          floor,
        ),
        ...(c.restores
          ? [
              row(
                `${label}: ${c.name}: restored, message -> first byte`,
                s.map((x) => x.restoreFirstByteMs ?? 0),
                floor,
              ),
            ]
          : []),
        row(
          `${label}: ${c.name}: checkpoint (runsc checkpoint, server's figure)`,
          s.map((x) => x.checkpointMs),
        ),
        row(
          `${label}: ${c.name}: checkpoint size (MiB, not ms)`,
          s.map((x) => x.checkpointBytes / 1024 / 1024),
        ),
      )
    }
  } finally {
    await server.close()
  }
  return platform
}

/**
 * `pause: memory` under gVisor: per agent, a new session's first message (a cold start, message POST
 * to first byte), the checkpoint the server takes when keep-warm ends (its own figure and the
 * image's size), and the next message restored from it (POST to first byte).
 */
export const pause: Bench = {
  name: 'pause',
  description: 'pause: memory under gVisor: checkpoint time and size, restore vs cold start to first byte',
  async run(): Promise<BenchResult> {
    const startedAt = new Date().toISOString()
    const t0 = performance.now()
    const rows: Row[] = []
    const notes: string[] = []
    const problems: string[] = []
    let platform = ''
    // Each way of restoring on a server of its own, one after the other in the same run: a
    // restore that boots its sandbox (no restore targets), then one into the target booted while
    // the session was paused (the default).
    for (const mode of MODES) {
      if (mode.targets === undefined) delete process.env.CAIRN_GVISOR_RESTORE_TARGETS
      else process.env.CAIRN_GVISOR_RESTORE_TARGETS = mode.targets
      try {
        platform = await measure(mode.label, rows, problems)
      } finally {
        delete process.env.CAIRN_GVISOR_RESTORE_TARGETS
      }
    }
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
          'two servers one after the other (CAIRN_GVISOR_RESTORE_TARGETS=0: the restore boots its sandbox; then the default: it loads into the sandbox booted while paused); on each, per run a new session (autoSnapshots off): first message POST -> first message.delta (cold), the checkpoint taken when keep-warm ends (the memory_paused event, sent once the pause is done: runsc checkpoint time and image bytes), then the second message POST -> first message.delta (restored); the session deleted, untimed',
      },
      rows,
      targets: [],
      notes,
    }
  },
}
