import { randomBytes } from 'node:crypto'
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import http2 from 'node:http2'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { Readable } from 'node:stream'
import { Runtime } from '../packages/runtime/dist/index.js'
import {
  type AgentSpec,
  initClusterTls,
  LocalRuntimePort,
  loadClusterTls,
  RemoteRuntimePort,
  type RuntimePort,
  runWithOwnerEpoch,
  serveRuntimePort,
  type WorkspaceMark,
} from '../packages/runtime/dist/port/index.js'
import { type Bench, progress, repeat, timedResult } from './lib/bench.js'
import { type Row, row } from './lib/stats.js'

const TURNS = 300
const FILE_MIB = 64
const FILE_RUNS = 10
const WARMUP = 30
const REVISION = 'rev_benchremote'
const ECHO = 'import sys\nwhile True:\n    line = input()\n    print("re:", line, flush=True)\n'

/** One turn to its outcome. */
async function turn(port: RuntimePort, sessionId: string, n: number): Promise<void> {
  const input = { prompt: `hi ${n}`, turn: n, turnId: `turn_b${n.toString(36)}`, transcript: [] }
  for await (const message of port.runTurn(sessionId, input))
    if (message.type === 'outcome' && message.outcome.status !== 'completed')
      throw new Error(`turn ${n}: ${message.outcome.status}`)
}

/**
 * A warm turn as the server made it before one call did it: the message check's and the
 * admission's looks at the agent, `resumeAgent`, the turn, a look at the agent after it, its
 * cooldown and the workspace's mark compared (`unchangedSince`): seven port calls.
 */
async function serverTurn(port: RuntimePort, spec: AgentSpec, n: number, mark: WorkspaceMark): Promise<void> {
  await port.agent(spec.sessionId)
  if (!(await port.agent(spec.sessionId))?.alive) throw new Error('the agent went cold')
  if (!(await port.resumeAgent(spec.sessionId))) throw new Error('the agent went cold')
  await turn(port, spec.sessionId, n)
  await port.agent(spec.sessionId)
  await port.coolDown(spec.sessionId, 600_000)
  await port.unchangedSince(spec.sessionId, mark)
}

/**
 * A warm turn as the server makes it now: the message check's look at the agent (which also
 * serves the admission), then one `runTurn` that resumes the agent, runs the turn, cools the
 * sandbox down and compares the workspace's mark.
 */
async function oneCallTurn(
  port: RuntimePort,
  spec: AgentSpec,
  n: number,
  mark: WorkspaceMark,
): Promise<void> {
  if (!(await port.agent(spec.sessionId))?.alive) throw new Error('the agent went cold')
  const input = { prompt: `hi ${n}`, turn: n, turnId: `turn_c${n.toString(36)}`, transcript: [] }
  let completed = false
  for await (const message of port.runTurn(spec.sessionId, input, {
    resume: true,
    keepWarmMs: 600_000,
    mark,
  })) {
    if (message.type === 'cold') throw new Error('the agent went cold')
    if (message.type === 'outcome')
      completed = message.outcome.status === 'completed' && !!message.after?.agent
  }
  if (!completed) throw new Error(`turn ${n} did not complete warm`)
}

async function timed(runs: number, fn: (i: number) => Promise<unknown>): Promise<number[]> {
  const samples: number[] = []
  await repeat(runs, 60_000, async (i) => {
    const t0 = performance.now()
    await fn(i)
    samples.push(performance.now() - t0)
  })
  return samples
}

/**
 * A warm turn through the runtime port in this process (`LocalRuntimePort`) and through the
 * network port (`RemoteRuntimePort` → `serveRuntimePort` → the same LocalRuntimePort, HTTP/2 over
 * mutual TLS on loopback), beside a bare HTTP/2 round trip on the same TLS as the floor.
 */
export const remotePort: Bench = {
  name: 'remote-port',
  description: 'warm turn through LocalRuntimePort vs RemoteRuntimePort (h2 + mTLS, loopback)',
  run: () =>
    timedResult('remote-port', async () => {
      const work = await mkdtemp(path.join(tmpdir(), 'cairn-bench-remote-'))
      const runtime = new Runtime({ dataDir: path.join(work, 'data'), poolImageSizeBytes: 512 * 1024 * 1024 })
      await runtime.open()
      const local = new LocalRuntimePort(runtime, { clock: { now: () => Date.now() } })
      await initClusterTls(path.join(work, 'cluster'))
      const nodeTls = await loadClusterTls(path.join(work, 'cluster'), 'node')
      const apiTls = await loadClusterTls(path.join(work, 'cluster'), 'api')
      const served = await serveRuntimePort(local, { host: '127.0.0.1', port: 0, tls: nodeTls })
      const remote = new RemoteRuntimePort({ url: served.url, tls: apiTls })
      // The floor: an HTTP/2 stream on the same kind of connection, answered at once.
      const bare = http2.createSecureServer({ ...nodeTls, requestCert: true })
      bare.on('stream', (stream) => {
        stream.respond({ ':status': 200 })
        stream.end('{}\n')
      })
      await new Promise<void>((resolve) => bare.listen(0, '127.0.0.1', resolve))
      const bareSession = http2.connect(`https://127.0.0.1:${(bare.address() as { port: number }).port}`, {
        ...apiTls,
        checkServerIdentity: () => undefined,
      })
      const roundTrip = () =>
        new Promise<void>((resolve, reject) => {
          const stream = bareSession.request({ ':method': 'POST', ':path': '/' })
          stream.on('error', reject)
          stream.resume()
          stream.on('end', resolve)
          stream.end('[]\n')
        })
      try {
        const staging = await runtime.pool.createStaging(REVISION)
        await mkdir(staging, { recursive: true })
        await writeFile(path.join(staging, 'agent.py'), ECHO)
        await runtime.pool.sealRevision(staging, REVISION)
        const spec = (sessionId: string): AgentSpec => ({
          sessionId,
          tenantId: 'ten_bench',
          command: ['python3', 'agent.py'],
          protocol: 'stdio',
          env: {},
          limits: { memoryMiB: 256, pids: 64, cpus: 1 },
          turnTimeoutMs: 30_000,
        })
        const [viaLocal, viaRemote] = [spec('ses_benchlocal'), spec('ses_benchremote')]
        await local.createWorkspace(viaLocal.sessionId, REVISION, 'ten_bench')
        await local.startAgent(viaLocal)
        await runWithOwnerEpoch(1, async () => {
          await remote.createWorkspace(viaRemote.sessionId, REVISION, 'ten_bench')
          await remote.startAgent(viaRemote)
        })
        const onRemote = <T>(fn: () => Promise<T>) => runWithOwnerEpoch(1, fn)

        progress(`floors: ${TURNS} bare h2 round trips, ${TURNS} port calls (warmCount) each way`)
        await timed(WARMUP, roundTrip)
        const h2 = row('bare HTTP/2 round trip (mTLS, loopback)', await timed(TURNS, roundTrip))
        const h2Floor = { name: 'bare h2', median: h2.summary.median }
        const localCall = row('port call, local (warmCount)', await timed(TURNS, () => local.warmCount()))
        await timed(WARMUP, () => remote.warmCount())
        const remoteCall = row(
          'port call, remote (warmCount)',
          await timed(TURNS, () => remote.warmCount()),
          h2Floor,
        )

        progress(
          `warm turns: ${WARMUP} warm-up then ${TURNS} each, runTurn alone and as the server makes one`,
        )
        await timed(WARMUP, (i) => turn(local, viaLocal.sessionId, i))
        const localTurn = row(
          'warm turn, local (runTurn)',
          await timed(TURNS, (i) => turn(local, viaLocal.sessionId, i + WARMUP)),
        )
        await timed(WARMUP, (i) => onRemote(() => turn(remote, viaRemote.sessionId, i)))
        const remoteTurn = row(
          'warm turn, remote (runTurn)',
          await timed(TURNS, (i) => onRemote(() => turn(remote, viaRemote.sessionId, i + WARMUP))),
          { name: 'local turn', median: localTurn.summary.median },
        )
        const localMark = await local.snapshotWorkspace(viaLocal.sessionId, 'snp_benchlocal', 'ten_bench')
        const remoteMark = await onRemote(() =>
          remote.snapshotWorkspace(viaRemote.sessionId, 'snp_benchremote', 'ten_bench'),
        )
        if (!localMark || !remoteMark) throw new Error('no workspace mark')
        const localServer = row(
          'warm turn, local, as the server made it before (7 port calls)',
          await timed(TURNS, (i) => serverTurn(local, viaLocal, i + 1000, localMark)),
        )
        const remoteServer = row(
          'warm turn, remote, as the server made it before (7 port calls)',
          await timed(TURNS, (i) => onRemote(() => serverTurn(remote, viaRemote, i + 1000, remoteMark))),
          { name: 'local, same calls', median: localServer.summary.median },
        )
        const localOne = row(
          'warm turn, local, as the server makes it now (agent + one runTurn)',
          await timed(TURNS, (i) => oneCallTurn(local, viaLocal, i + 2000, localMark)),
        )
        const remoteOne = row(
          'warm turn, remote, as the server makes it now (agent + one runTurn)',
          await timed(TURNS, (i) => onRemote(() => oneCallTurn(remote, viaRemote, i + 2000, remoteMark))),
          { name: 'local, same calls', median: localOne.summary.median },
        )
        progress(`a ${FILE_MIB} MiB file read ${FILE_RUNS} times each way`)
        await local.writeFile(
          viaLocal.sessionId,
          'big.bin',
          Readable.from(
            (function* () {
              for (let i = 0; i < FILE_MIB; i++) yield randomBytes(1024 * 1024)
            })(),
          ),
        )
        const readFile = async (port: RuntimePort) => {
          const file = await port.openFile({ sessionId: viaLocal.sessionId }, Buffer.from('big.bin'))
          let bytes = 0
          for await (const chunk of file.stream) bytes += (chunk as Buffer).length
          if (bytes !== FILE_MIB * 1024 * 1024) throw new Error(`read ${bytes} bytes`)
        }
        const localFile = row(
          `${FILE_MIB} MiB file read, local (openFile)`,
          await timed(FILE_RUNS, () => readFile(local)),
        )
        const remoteFile = row(
          `${FILE_MIB} MiB file read, remote (openFile)`,
          await timed(FILE_RUNS, () => onRemote(() => readFile(remote))),
          { name: 'local read', median: localFile.summary.median },
        )
        const rows: Row[] = [
          h2,
          localCall,
          remoteCall,
          localTurn,
          remoteTurn,
          localServer,
          remoteServer,
          localOne,
          remoteOne,
          localFile,
          remoteFile,
        ]
        const extra = remoteTurn.summary.median - localTurn.summary.median
        return {
          config: {
            turns: TURNS,
            warmup: WARMUP,
            agent: 'python3 stdio echo',
            transport: 'HTTP/2, mutual TLS, 127.0.0.1',
          },
          rows,
          targets: [],
          notes: [
            `the network port adds ${extra.toFixed(2)} ms to runTurn (${(extra / h2.summary.median).toFixed(1)} bare h2 round trips)`,
            `a warm turn as the server makes it now costs ${(remoteOne.summary.median - localOne.summary.median).toFixed(2)} ms more remote than local (before: ${(remoteServer.summary.median - localServer.summary.median).toFixed(2)} ms)`,
          ],
        }
      } finally {
        bareSession.destroy()
        bare.close()
        await remote.close()
        await served.close()
        await local.stopAllAgents()
        await runtime.close()
        await rm(work, { recursive: true, force: true })
      }
    }),
}
