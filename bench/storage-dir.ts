import { rm } from 'node:fs/promises'
import path from 'node:path'
import { execTool } from '../packages/runtime/dist/index.js'
import { type Bench, progress, repeat, timedResult } from './lib/bench.js'
import { makeProject, SHELL_AGENT, startBenchServer } from './lib/server.js'
import { count, fillCommand, postExpecting, SizeSamples, shell } from './lib/shell-workspace.js'

const SIZES = [100, 10_000] as const
const RUNS = 10
type Size = (typeof SIZES)[number]
const OPS = ['snapshot', 'restore', 'fork', 'snapshot, warm sandbox'] as const
type Op = (typeof OPS)[number]

/**
 * The `dir` storage driver (plain directories, every copy a `cp -a --reflink=auto`) on the data
 * dir's filesystem: snapshot, restore and fork through the API for 100 and 10,000 files, beside
 * `cp -a` of the same tree. The same operations on btrfs are in the `snapshots` bench.
 */
export const storageDir: Bench = {
  name: 'storage-dir',
  description: 'the dir storage driver: snapshot, restore, fork via the API for 100 / 10,000 files vs cp -a',
  run: () =>
    timedResult('storage-dir', async () => {
      const project = await makeProject('shell', 2, SHELL_AGENT)
      const server = await startBenchServer({ server: { storage: 'dir' } })
      try {
        const { agent } = await server.deploy(project)
        const sessions = {} as Record<Size, string>
        for (const size of SIZES) {
          progress(`writing ${count(size)} files in a session (shell agent, dir driver)`)
          const { id } = await server.createSession(agent, { autoSnapshots: false, keepWarmMs: 600_000 })
          const text = await shell(server, id, fillCommand(size))
          if (Number.parseInt(text, 10) !== size)
            throw new Error(`expected ${size} files, the agent said ${text}`)
          sessions[size] = id
        }
        const api = (route: string, body: unknown, status: number) =>
          postExpecting(server, route, body, status)
        const samples = new SizeSamples()
        const add = (size: Size, op: Op | 'cp -a', ms: number) => samples.add(size, op, ms)
        const forks: string[] = []
        progress(`${RUNS} runs per size, sizes alternating`)
        const { truncated } = await repeat(RUNS, 120_000, async () => {
          for (const size of SIZES) {
            const id = sessions[size]
            const snap = await api(`/v1/sessions/${id}/snapshots`, {}, 201)
            add(size, 'snapshot', snap.ms)
            add(
              size,
              'restore',
              (await api(`/v1/sessions/${id}/restore`, { snapshotId: snap.body.id }, 200)).ms,
            )
            const fork = await api(`/v1/sessions/${id}/fork`, { snapshotId: snap.body.id }, 201)
            forks.push(fork.body.id)
            add(size, 'fork', fork.ms)
            await shell(server, id, ':')
            add(size, 'snapshot, warm sandbox', (await api(`/v1/sessions/${id}/snapshots`, {}, 201)).ms)
          }
        })
        for (const id of forks) await server.deleteSession(id)
        progress('floor: cp -a of each workspace on the same filesystem')
        const copy = path.join(server.server.runtime.pool.root, 'staging', 'bench-cp-a')
        for (const size of SIZES) {
          const source = server.server.runtime.pool.workspacePath(sessions[size])
          await repeat(5, 60_000, async () => {
            const a = performance.now()
            await execTool('cp', ['-a', source, copy])
            add(size, 'cp -a', performance.now() - a)
            await rm(copy, { recursive: true, force: true })
          })
        }
        const notes: string[] = []
        for (const op of ['snapshot', 'restore', 'fork'] as const) {
          const m = (size: Size) => samples.median(op, size)
          notes.push(`${op}: 100 files ${m(100).toFixed(1)} ms, 10,000 files ${m(10_000).toFixed(1)} ms`)
        }
        return {
          config: {
            runs: RUNS,
            truncated,
            storage: 'dir (cp -a --reflink=auto) on the data dir filesystem',
            client: 'node:http keep-alive',
            measured:
              'request to response of POST /v1/sessions/{id}/snapshots, /restore {snapshotId}, /fork {snapshotId}; "warm sandbox": after a turn, so the snapshot freezes the sandbox for the whole copy',
          },
          rows: samples.rows(SIZES, OPS, 'cp -a'),
          targets: [],
          notes,
        }
      } finally {
        await server.close()
        await rm(project, { recursive: true, force: true })
      }
    }),
}
