/**
 * Where a turn's time goes. Wraps methods of the built server and runtime at run time (in this
 * process only; nothing in packages/ is changed), runs turns, and prints the median and p99 of
 * every step of the timeline, and, for slow runs, the step that took longest.
 *
 *   node --import tsx bench/profile.ts warm [echo|notes] [runs]   # turns on one warm session
 *   node --import tsx bench/profile.ts cold [echo|notes] [runs]   # new session + first message
 *   node --import tsx bench/profile.ts restore [echo|notes] [runs] # a paused (pause: memory, gVisor)
 *                                                               # session's next message, restored
 *
 * Add --cpu-prof --cpu-prof-dir=DIR after `node` for a V8 CPU profile of the same runs.
 *
 * --no-auto-snapshots creates the sessions with autoSnapshots: false.
 *
 * --gap=MS waits MS between runs (think time), so work left by a turn is done before the next.
 *
 * --what-if=append-transcript simulates the fix proposed in docs/benchmarks/targets.md: the transcript
 * file is appended synchronously with only the lines that are new, instead of the whole
 * transcript being read from the database and rewritten (three async file operations) every turn.
 */

import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { RunDir } from '../packages/runtime/dist/agent/run-dir.js'
import {
  AgentProcess,
  BtrfsPool,
  BwrapDriver,
  CgroupManager,
  GvisorDriver,
  MemoryCheckpoints,
  Runtime,
} from '../packages/runtime/dist/index.js'
import { SessionService } from '../packages/server/dist/index.js'
import { TranscriptCache } from '../packages/server/dist/sessions/transcript-cache.js'
import { WarmAgents } from '../packages/server/dist/sessions/warm-agents.js'
import { SnapshotPolicy } from '../packages/server/dist/workspace/snapshot-policy.js'
import { runscRestoreFloor } from './lib/runsc-floors.js'
import { EXAMPLES, startBenchServer } from './lib/server.js'
import { printTable, type Row, row } from './lib/stats.js'

let marks = new Map<string, number>()
const mark = (label: string) => {
  if (!marks.has(label)) marks.set(label, performance.now())
}

// biome-ignore lint/suspicious/noExplicitAny: patching prototypes by name
function wrap(proto: any, method: string, label = method): void {
  const original = proto[method] as (...args: unknown[]) => unknown
  if (typeof original !== 'function') {
    console.warn(`(no method ${method} to time: the code changed; skipped)`)
    return
  }
  proto[method] = function (this: unknown, ...args: unknown[]) {
    mark(`${label} >`)
    const out = original.apply(this, args)
    if (out instanceof Promise) return out.finally(() => mark(`${label} <`))
    mark(`${label} <`)
    return out
  }
}

const positional = process.argv.slice(2).filter((a) => !a.startsWith('--'))
const whatIf = process.argv.includes('--what-if=append-transcript')
/** Idle time between runs (--gap=MS): lets work a turn leaves behind (post-turn snapshots) finish. */
const gapMs = Number(process.argv.find((a) => a.startsWith('--gap='))?.slice(6) ?? 0)
/** --no-auto-snapshots: sessions created with autoSnapshots: false (no snapshot before each turn). */
const autoSnapshots = !process.argv.includes('--no-auto-snapshots')
const mode = positional[0] === 'cold' || positional[0] === 'restore' ? positional[0] : 'warm'
const agentName = positional[1] ?? 'echo'
const runs = Number(positional[2] ?? (mode === 'warm' ? 300 : mode === 'cold' ? 60 : 20))
const warmup = mode === 'warm' ? 20 : mode === 'cold' ? 5 : 2
const slowMs = mode === 'warm' ? 15 : mode === 'cold' ? 60 : 300

/** Marks the sandbox's first stdin write and each stdout chunk of a started or restored sandbox. */
function watchSandbox(
  sandbox: { stdin: NodeJS.WritableStream; stdout: NodeJS.ReadableStream },
  first: string,
) {
  mark('sandbox handed over')
  const write = sandbox.stdin.write.bind(sandbox.stdin) as (...a: unknown[]) => boolean
  // biome-ignore lint/suspicious/noExplicitAny: instrumenting a stream
  ;(sandbox.stdin as any).write = (...a: unknown[]) => {
    mark('stdin.write')
    return write(...a)
  }
  sandbox.stdout.prependListener('data', () => mark(first))
}

/** A copy of the example with `isolation: gvisor` and `pause: memory` (restore mode). */
async function pausingCopy(name: string): Promise<string> {
  const dir = mkdtempSync(path.join(tmpdir(), `cairn-profile-${name}-`))
  cpSync(path.join(EXAMPLES, name), dir, { recursive: true })
  const manifest = readFileSync(path.join(dir, 'cairn.yaml'), 'utf8')
  writeFileSync(path.join(dir, 'cairn.yaml'), `${manifest}isolation: gvisor\npause: memory\n`)
  return dir
}

/** Waits for the session's checkpoint (its memory_paused event). */
async function waitForPause(id: string): Promise<void> {
  for (let i = 0; i < 1500; i++) {
    const res = await server.http.json('GET', `/v1/sessions/${id}/events`)
    if ((res.body.data as { cause: string }[]).some((e) => e.cause === 'memory_paused')) return
    await new Promise((r) => setTimeout(r, 20))
  }
  throw new Error(`no memory_paused event for ${id}`)
}

const server = await startBenchServer(
  mode === 'restore' ? { server: { gvisorPoolSize: 0, residentPauses: 0 } } : {},
)
try {
  wrap(SessionService.prototype, 'create', 'sessions.create')
  wrap(SessionService.prototype, 'beginTurn')
  wrap(WarmAgents.prototype, 'acquire', 'agentFor')
  wrap(TranscriptCache.prototype, 'before', 'transcriptBefore')
  const storeProto = Object.getPrototypeOf(server.server.sessions.store)
  for (const m of ['insert', 'startTurn', 'transition', 'setTurnSandbox', 'finishTurn', 'turns'])
    wrap(storeProto, m, `store.${m}`)
  wrap(BtrfsPool.prototype, 'createWorkspace', 'pool.createWorkspace')
  wrap(Runtime.prototype, 'startAgent', 'runtime.startAgent')
  wrap(AgentProcess.prototype, 'start', 'agent.start')
  wrap(RunDir.prototype, 'writeTranscript')
  wrap(AgentProcess.prototype, 'runTurn', 'agent.runTurn')
  wrap(CgroupManager.prototype, 'create', 'cgroups.create')
  wrap(CgroupManager.prototype, 'freeze', 'cgroups.freeze')
  wrap(BtrfsPool.prototype, 'snapshotWorkspace', 'pool.snapshotWorkspace')
  // The check that lets a turn which wrote nothing reuse the previous snapshot.
  wrap(AgentProcess.prototype, 'writtenBytes', 'agent.writtenBytes')
  wrap(BtrfsPool.prototype, 'workspaceMark', 'pool.workspaceMark')
  // The session observers the composition root passes in (pre-turn snapshots, …).
  wrap(SnapshotPolicy.prototype, 'beforeTurn', 'beforeTurn observer')
  wrap(SnapshotPolicy.prototype, 'afterTurn', 'afterTurn observer')
  const start = BwrapDriver.prototype.start
  BwrapDriver.prototype.start = async function (this: BwrapDriver, spec) {
    const sandbox = await start.call(this, spec)
    // The first output of a fresh agent is the shim's marker at its first read: the agent is up.
    watchSandbox(sandbox, mode === 'cold' ? 'agent ready (first stdout)' : 'stdout')
    return sandbox
  }
  // A resumed session: the checkpoint looked up, the sandbox's bundle, cgroups and `runsc restore`
  // spawned (launch), then polled with `runsc state` until it runs (restore <), the image deleted.
  wrap(MemoryCheckpoints.prototype, 'find', 'checkpoints.find')
  wrap(MemoryCheckpoints.prototype, 'discard', 'checkpoints.discard')
  wrap(GvisorDriver.prototype, 'launch', 'gvisor.launch (bundle, cgroups, spawn runsc restore)')
  const restore = GvisorDriver.prototype.restore
  GvisorDriver.prototype.restore = async function (this: GvisorDriver, spec, imageDir) {
    mark('gvisor.restore >')
    const sandbox = await restore.call(this, spec, imageDir)
    mark('gvisor.restore < (runsc state: running)')
    watchSandbox(sandbox, 'agent reply (first stdout)')
    return sandbox
  }

  if (whatIf) {
    // biome-ignore lint/suspicious/noExplicitAny: simulating a change to private methods
    const transcripts = TranscriptCache.prototype as any
    // The agent process already holds turns 1..n-1; only the last finished turn is new, read
    // with one prepared statement instead of every turn of the session.
    let lastTurn: { get(id: string, seq: number): { prompt: string; response: string | null } | undefined }
    transcripts.before = function (
      this: { store: { db: { prepare(sql: string): typeof lastTurn } } },
      id: string,
      seq: number,
    ) {
      lastTurn ??= this.store.db.prepare(
        'SELECT prompt, response FROM turns WHERE session_id = ? AND seq = ?',
      )
      const turn = seq > 1 ? lastTurn.get(id, seq - 1) : undefined
      if (!turn) return []
      const lines = [{ v: 1, role: 'user', turn: seq - 1, content: turn.prompt }]
      if (turn.response) lines.push({ v: 1, role: 'assistant', turn: seq - 1, content: turn.response })
      return lines
    }
    // biome-ignore lint/suspicious/noExplicitAny: simulating a change to private methods
    ;(RunDir.prototype as any).writeTranscript = async function (this: { dir: string }, lines: unknown[]) {
      if (lines.length === 0) return
      const body = `${lines.map((l) => JSON.stringify(l)).join('\n')}\n`
      writeFileSync(path.join(this.dir, 'transcript.jsonl'), body, { flag: 'a' })
    }
  }

  const project = mode === 'restore' ? await pausingCopy(agentName) : `${EXAMPLES}/${agentName}`
  await server.deploy(project)
  if (mode === 'restore') rmSync(project, { recursive: true, force: true })
  const intervals = new Map<string, number[]>()
  const totals: number[] = []
  const slow = new Map<string, number[]>()
  let warmSession: string | undefined
  for (let i = 0; i < runs + warmup; i++) {
    if (gapMs > 0) await new Promise((r) => setTimeout(r, gapMs))
    marks = new Map()
    mark('client start')
    const sent = marks.get('client start') as number
    let id = warmSession
    if (!id) {
      id = (
        await server.createSession(agentName, {
          keepWarmMs: mode === 'restore' ? 200 : 600_000,
          ...(autoSnapshots && mode !== 'restore' ? {} : { autoSnapshots: false }),
        })
      ).id
      mark('client session created')
      if (mode === 'warm') warmSession = id
    }
    if (mode === 'restore') {
      // Untimed: a cold first message, then the checkpoint when keep-warm (200 ms) ends.
      await server.http.stream(`/v1/sessions/${id}/messages`, { prompt: 'cold' })
      await waitForPause(id)
      marks = new Map()
    }
    const before = performance.now()
    mark('client message POST')
    const t = await server.http.stream(`/v1/sessions/${id}/messages`, { prompt: `turn ${i}` })
    if (t.terminal !== 'run.completed') throw new Error(`run ${i}: ${t.terminal} ${t.error}`)
    marks.set('client message POST', before)
    marks.set('client headers', before + t.headersMs)
    marks.set('client first delta', before + (t.firstDeltaMs as number))
    marks.set('client run.completed', before + (t.completedMs as number))
    if (mode !== 'warm') await server.deleteSession(id)
    if (i < warmup) continue
    const ordered = [...marks.entries()].sort((a, b) => a[1] - b[1])
    let worst: [string, number] = ['', 0]
    for (let k = 1; k < ordered.length; k++) {
      const [from, a] = ordered[k - 1] as [string, number]
      const [to, b] = ordered[k] as [string, number]
      const key = `${from} -> ${to}`
      if (!intervals.has(key)) intervals.set(key, [])
      intervals.get(key)?.push(b - a)
      if (b - a > worst[1]) worst = [key, b - a]
    }
    const total = (marks.get('client first delta') as number) - (mode === 'restore' ? before : sent)
    totals.push(total)
    if (total > slowMs) {
      if (!slow.has(worst[0])) slow.set(worst[0], [])
      slow.get(worst[0])?.push(worst[1])
    }
  }
  const rows: Row[] = [...intervals.entries()]
    .filter(([, s]) => s.length >= runs / 2)
    .map(([key, s]) => row(key, s, undefined, s.length < runs ? `${s.length} of ${runs} runs` : undefined))
  rows.push(row(mode === 'cold' ? 'TOTAL create -> first delta' : 'TOTAL POST -> first delta', totals))
  if (mode === 'restore') {
    const driver = server.server.runtime.drivers.gvisor as InstanceType<typeof GvisorDriver>
    rows.push(
      row(`floor: runsc restore alone (${driver.runsc.platform})`, await runscRestoreFloor(driver.runsc, 8)),
      row(
        `what-if: runsc restore into a pre-started target (runsc create ahead, ${driver.runsc.platform})`,
        await runscRestoreFloor(driver.runsc, 8, { preCreated: true }),
      ),
    )
  }
  printTable(
    `${agentName} ${mode}${whatIf ? ' (what-if: append-transcript)' : ''}${gapMs ? ` (gap ${gapMs} ms)` : ''}${autoSnapshots ? '' : ' (no auto snapshots)'}: timeline (${runs} runs after ${warmup} warm-up)`,
    rows,
  )
  if (slow.size > 0)
    printTable(
      `runs over ${slowMs} ms: the step that took longest in each`,
      [...slow.entries()].map(([key, s]) => row(key, s)),
    )
  if (warmSession) await server.deleteSession(warmSession)
} finally {
  await server.close()
}
