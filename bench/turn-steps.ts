/**
 * Where a warm turn's time goes, per driver:
 * `node --import tsx bench/turn-steps.ts [bwrap|gvisor] [echo|notes] [turns]` (build first).
 * Paced warm turns of one agent (as in `drivers`), with the steps around a turn timed by
 * wrapping them on this process's objects (nothing in the product logs): the freeze and thaw of a
 * snapshot, the snapshot itself, the written-bytes and change-mark reads, the generation marker,
 * and every host process the server spawns while the turns run (a `runsc` command costs ~10 ms).
 * Not part of `npm run bench`: a diagnostic for issue 10, printed as a table of medians.
 */
import { ChildProcess } from 'node:child_process'
import { AgentProcess } from '../packages/runtime/dist/index.js'
import { EXAMPLES, startBenchServer } from './lib/server.js'
import { PACED_GAP_MS, pacedTurns, roundTrips, TURN_CASES, turnSender } from './lib/turns.js'

const driver = (process.argv[2] ?? 'gvisor') as 'bwrap' | 'gvisor'
const agent = process.argv[3] ?? 'echo'
const TURNS = Number(process.argv[4] ?? 100)
const WARMUP = 20

const samples = new Map<string, number[]>()
let recording = false
const record = (label: string, ms: number) => {
  if (!recording) return
  const list = samples.get(label) ?? []
  list.push(ms)
  samples.set(label, list)
}

/** Replaces `obj[name]` (a method) by one that records how long each call took. */
function time<T extends object>(obj: T, name: keyof T & string, label: string): void {
  const original = obj[name] as unknown as (...args: unknown[]) => unknown
  ;(obj as Record<string, unknown>)[name] = function (this: unknown, ...args: unknown[]) {
    const t0 = performance.now()
    const out = original.apply(this, args)
    if (out instanceof Promise) return out.finally(() => record(label, performance.now() - t0))
    record(label, performance.now() - t0)
    return out
  }
}

// Every host process the server starts (execFile and spawn both go through this).
const spawned = new Map<string, number>()
const proto = ChildProcess.prototype as unknown as {
  spawn: (options: { file: string; args: string[] }) => unknown
}
const originalSpawn = proto.spawn
proto.spawn = function (this: ChildProcess, options) {
  if (recording) {
    const what = [options.file, ...options.args.slice(1).filter((a) => !a.startsWith('-'))]
      .slice(0, 3)
      .join(' ')
    const key = what.includes('runsc') ? `runsc ${options.args.find((a) => /^[a-z]+$/.test(a)) ?? ''}` : what
    spawned.set(key, (spawned.get(key) ?? 0) + 1)
  }
  return originalSpawn.call(this, options)
}

time(AgentProcess.prototype, 'freeze', 'freeze (sandbox)')
time(AgentProcess.prototype, 'thaw', 'thaw (sandbox)')
time(AgentProcess.prototype, 'writtenBytes', 'writtenBytes()')
time(AgentProcess.prototype, 'runTurn', 'agent.runTurn (prompt -> turn end)')

const server = await startBenchServer({
  server: driver === 'gvisor' ? { isolation: 'gvisor', gvisorPoolSize: 1 } : { isolation: 'bwrap' },
})
try {
  const pool = server.server.runtime.pool
  time(pool, 'snapshotWorkspace', 'btrfs snapshot')
  time(pool, 'workspaceMark', 'workspace ctransid')
  time(pool, 'writeGeneration', 'generation marker (xattr)')
  console.error(server.server.runtime.driver.describe())
  const turnCase = TURN_CASES.find((c) => c.name === agent) ?? (TURN_CASES[0] as (typeof TURN_CASES)[number])
  await server.deploy(`${EXAMPLES}/${turnCase.name}`)
  const session = await server.createSession(turnCase.name, { keepWarmMs: 10 * 60_000 })
  const problems: string[] = []
  const sender = turnSender(session.id, turnCase, problems)
  for (let i = 0; i < WARMUP; i++) await sender.send(server.http)
  recording = true
  const paced = await pacedTurns(sender, server.http, TURNS, PACED_GAP_MS, 120_000)
  recording = false
  if (problems.length > 0) throw new Error(problems.slice(0, 5).join('\n'))
  record('turn round trip (POST -> run.completed)', 0)
  samples.set('turn round trip (POST -> run.completed)', roundTrips(paced.timings))
  samples.set(
    'server durationMs',
    paced.timings.map((t) => t.serverDurationMs as number),
  )
  const median = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b)
    return s[Math.floor(s.length / 2)] ?? Number.NaN
  }
  const n = paced.timings.length
  console.log(`\n${driver}: ${n} paced warm turns (${turnCase.name}, ${PACED_GAP_MS} ms think time)`)
  console.log(`${'step'.padEnd(42)} ${'calls/turn'.padStart(10)} ${'median ms'.padStart(10)}`)
  for (const [label, xs] of samples) {
    console.log(
      `${label.padEnd(42)} ${(xs.length / n).toFixed(2).padStart(10)} ${median(xs).toFixed(2).padStart(10)}`,
    )
  }
  console.log('\nhost processes spawned per turn')
  for (const [what, count] of spawned)
    console.log(`${what.padEnd(42)} ${(count / n).toFixed(2).padStart(10)}`)
  await server.deleteSession(session.id)
} finally {
  await server.close()
}
