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

const RUNS = Number(process.env.BENCH_FORK_RUNS ?? 5)
/** The larger fork of each run (issue 31 asks for 1 and 10). */
const MANY = 10

interface Sample {
  coldFirstByteMs: number
  forkOneMs: number
  forkManyMs: number
  forkFirstByteMs: number
}

/** The echo example as a gVisor agent with `pause: memory`. */
async function echoProject(): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-bench-fork-'))
  await cp(path.join(EXAMPLES, 'echo'), dir, { recursive: true })
  const manifest = await readFile(path.join(dir, 'cairn.yaml'), 'utf8')
  await writeFile(path.join(dir, 'cairn.yaml'), `${manifest}isolation: gvisor\npause: memory\n`)
  return dir
}

/** POST …/forks {memory: true, count}: its time and the forks' IDs. */
async function forkNow(
  server: BenchServer,
  id: string,
  count: number,
): Promise<{ ms: number; ids: string[] }> {
  const res = await server.http.json('POST', `/v1/sessions/${id}/forks`, { memory: true, count })
  if (res.status !== 201)
    throw new Error(`fork of ${id} (${count}): ${res.status} ${JSON.stringify(res.body)}`)
  return { ms: res.ms, ids: (res.body.sessions as { id: string }[]).map((s) => s.id) }
}

/** A message POST to its first byte; `cold` says which kind of start it must have been. */
async function firstByte(server: BenchServer, id: string, cold: boolean): Promise<number> {
  const run = await server.http.stream(`/v1/sessions/${id}/messages`, { prompt: 'hello' })
  if (run.terminal !== 'run.completed' || run.firstDeltaMs === undefined || run.coldStart !== cold)
    throw new Error(`message to ${id}: ${run.terminal} cold=${run.coldStart} ${JSON.stringify(run.text)}`)
  if (run.text !== 'hello\n') throw new Error(`message to ${id}: reply ${JSON.stringify(run.text)}`)
  return run.firstDeltaMs
}

/**
 * One run: a new warm session (its first message a cold start), a fork with memory of it (1), its
 * next message (restored from its own checkpoint), a fork with memory of 10, one of the 10 forks'
 * first message (restored from the fork's copy). Every session is deleted, untimed.
 */
async function once(server: BenchServer): Promise<Sample> {
  const made: string[] = []
  try {
    const parent = await server.createSession('echo', { keepWarmMs: 600_000, autoSnapshots: false })
    made.push(parent.id)
    const coldFirstByteMs = await firstByte(server, parent.id, true)
    const one = await forkNow(server, parent.id, 1)
    made.push(...one.ids)
    await firstByte(server, parent.id, false)
    const many = await forkNow(server, parent.id, MANY)
    made.push(...many.ids)
    const forkFirstByteMs = await firstByte(server, many.ids[0] ?? '', false)
    return { coldFirstByteMs, forkOneMs: one.ms, forkManyMs: many.ms, forkFirstByteMs }
  } finally {
    for (const id of made) await server.deleteSession(id)
  }
}

/**
 * `POST /v1/sessions/{id}/forks {memory: true}` under gVisor: the time to make 1 and 10 forks of a
 * warm echo session (its checkpoint, the snapshot, the image copies and the forks' rows), beside a
 * cold start's first byte and `runsc do /bin/true` in the same run, and a fork's first message.
 */
export const forkMemory: Bench = {
  name: 'fork-memory',
  description: 'forks with memory under gVisor: 1 and 10 forks of a warm session beside a cold start',
  async run(): Promise<BenchResult> {
    const startedAt = new Date().toISOString()
    const t0 = performance.now()
    const rows: Row[] = []
    // On-demand sandboxes, as every pause: memory session's (a restore runs the cold layout).
    const server = await startBenchServer({ server: { gvisorPoolSize: 0 } })
    let platform = ''
    try {
      const driver = server.server.runtime.drivers.gvisor as GvisorDriver
      const dir = await echoProject()
      await server.deploy(dir)
      await rm(dir, { recursive: true, force: true })
      await once(server)
      // Chosen at the first sandbox's start: systrap where it starts one here, else ptrace.
      platform = driver.runsc.platform
      const floorSamples: number[] = []
      for (let i = 0; i < 10; i++) floorSamples.push(await runscTrue(driver.runsc))
      const floor = { name: `runsc do /bin/true (${platform})`, median: row('', floorSamples).summary.median }
      rows.push(row(floor.name, floorSamples))
      progress(`${RUNS} runs: cold start, fork of 1, fork of ${MANY}`)
      const samples: Sample[] = []
      await repeat(RUNS, 600_000, async () => {
        samples.push(await once(server))
      })
      rows.push(
        row(
          'echo: cold start, message -> first byte',
          samples.map((s) => s.coldFirstByteMs),
          floor,
        ),
        row(
          'fork with memory, 1 fork (POST -> 201)',
          samples.map((s) => s.forkOneMs),
          floor,
        ),
        row(
          `fork with memory, ${MANY} forks (POST -> 201)`,
          samples.map((s) => s.forkManyMs),
          floor,
        ),
        row(
          `fork with memory, ${MANY} forks, per fork`,
          samples.map((s) => s.forkManyMs / MANY),
        ),
        row(
          "a fork's first message (restored) -> first byte",
          samples.map((s) => s.forkFirstByteMs),
          floor,
        ),
      )
    } finally {
      await server.close()
    }
    return {
      bench: 'fork-memory',
      startedAt,
      durationMs: performance.now() - t0,
      machine: machineInfo(),
      config: {
        runs: RUNS,
        many: MANY,
        platform,
        measured:
          'per run a new echo session (gvisor, pause: memory, autoSnapshots off, kept warm): its first message POST -> first message.delta (cold); POST /forks {memory: true, count: 1} -> 201 (checkpoint of the warm sandbox, snapshot, image copy, fork rows); the parent messaged again (restored); POST /forks {memory: true, count: 10} -> 201; one of the ten forks messaged (restored, POST -> first byte); all deleted, untimed',
      },
      rows,
      targets: [],
      notes: [],
    }
  },
}
