import { rm } from 'node:fs/promises'
import path from 'node:path'
import { execTool } from '../packages/runtime/dist/index.js'
import { type Bench, progress, repeat, timedResult } from './lib/bench.js'
import type { Target } from './lib/results.js'
import { makeProject, SHELL_AGENT, startBenchServer } from './lib/server.js'
import { count, fillCommand, postExpecting, SizeSamples, shell } from './lib/shell-workspace.js'

const SIZES = [100, 10_000, 100_000] as const
const RUNS = 20
/** `cp -a` of 100,000 files takes seconds: fewer runs of the floor for the large trees. */
const CP_RUNS: Record<number, number> = { 100: 10, 10000: 5, 100000: 3 }

type Size = (typeof SIZES)[number]
const OPS = ['snapshot', 'restore', 'fork', 'snapshot, warm sandbox', 'restore, warm sandbox'] as const
type Op = (typeof OPS)[number]

/**
 * Snapshot, restore and fork through the HTTP API for workspaces of 100, 10,000 and 100,000
 * files (written inside the session by a shell agent), beside `cp -a` of the same tree on the same
 * btrfs. Each run, per size (sizes alternate): with the sandbox stopped, a snapshot, a restore to
 * it and a fork of it; then a turn (`:`, untimed) warms the sandbox, and a snapshot (the sandbox
 * frozen around it) and a restore (which stops the sandbox first) are timed again.
 */
export const snapshots: Bench = {
  name: 'snapshots',
  description: 'snapshot, restore, fork via the API for 100 / 10,000 / 100,000 files vs cp -a',
  run: () =>
    timedResult('snapshots', async () => {
      const project = await makeProject('shell', 2, SHELL_AGENT)
      // 100,000 small files and the snapshots of them need more than the default 1 GiB pool.
      const server = await startBenchServer({ server: { poolImageSizeBytes: 4 * 1024 ** 3 } })
      try {
        const { agent } = await server.deploy(project)
        const sessions = {} as Record<Size, string>
        const fillMs = {} as Record<Size, number>
        for (const size of SIZES) {
          progress(`writing ${count(size)} files in a session (shell agent)`)
          const { id } = await server.createSession(agent, { autoSnapshots: false, keepWarmMs: 600_000 })
          const a = performance.now()
          const text = await shell(server, id, fillCommand(size))
          fillMs[size] = performance.now() - a
          if (Number.parseInt(text, 10) !== size)
            throw new Error(`expected ${size} files, the agent said ${text}`)
          sessions[size] = id
        }
        await execTool('sync', [])

        const api = (route: string, body: unknown, status: number) =>
          postExpecting(server, route, body, status)
        const samples = new SizeSamples()
        const add = (size: Size, op: Op | 'cp -a', ms: number) => samples.add(size, op, ms)
        const forks: string[] = []
        const once = async (size: Size, keep: boolean) => {
          const id = sessions[size]
          const record = (op: Op, ms: number) => keep && add(size, op, ms)
          // The sandbox was stopped by the last restore (or is warm from the fill, for the warm-up).
          const snap = await api(`/v1/sessions/${id}/snapshots`, { label: 'bench' }, 201)
          record('snapshot', snap.ms)
          record('restore', (await api(`/v1/sessions/${id}/restore`, { snapshotId: snap.body.id }, 200)).ms)
          const fork = await api(`/v1/sessions/${id}/fork`, { snapshotId: snap.body.id }, 201)
          forks.push(fork.body.id)
          record('fork', fork.ms)
          await shell(server, id, ':')
          const warm = await api(`/v1/sessions/${id}/snapshots`, { label: 'bench warm' }, 201)
          record('snapshot, warm sandbox', warm.ms)
          record(
            'restore, warm sandbox',
            (await api(`/v1/sessions/${id}/restore`, { snapshotId: warm.body.id }, 200)).ms,
          )
        }
        for (const size of SIZES) await once(size, false)
        progress(`${RUNS} runs per size, sizes alternating`)
        const { truncated } = await repeat(RUNS, 150_000, async () => {
          for (const size of SIZES) await once(size, true)
        })
        // Untimed: deleting subvolumes leaves work to the kernel's cleaner thread.
        for (const id of forks) await server.deleteSession(id)

        progress('floor: cp -a of each workspace to a directory on the same btrfs')
        const copy = path.join(server.server.runtime.pool.root, 'bench-cp-a')
        for (const size of SIZES) {
          const source = server.server.runtime.pool.workspacePath(sessions[size])
          await repeat(CP_RUNS[size] as number, 90_000, async () => {
            const a = performance.now()
            await execTool('cp', ['-a', source, copy])
            add(size, 'cp -a', performance.now() - a)
            await rm(copy, { recursive: true, force: true })
            await execTool('sync', [])
          })
        }

        const targets: Target[] = []
        const notes: string[] = []
        const median = (op: Op | 'cp -a', size: Size) => samples.median(op, size)
        for (const op of ['snapshot', 'restore', 'fork'] as const) {
          const large = median(op, 100_000)
          const small = median(op, 100)
          targets.push({
            name: `${op}, 100,000 files (issues 5, 9)`,
            goal: 'median < 30 ms',
            value: large,
            met: large < 30,
          })
          targets.push({
            name: `${op} flat in the file count (issue 5)`,
            goal: `median(100,000 files) - median(100 files) < 5 ms (100 files: ${small.toFixed(2)} ms)`,
            value: large - small,
            met: large - small < 5,
          })
          notes.push(
            `${op}: 100 files ${small.toFixed(2)} ms, 10,000 files ${median(op, 10_000).toFixed(2)} ms, 100,000 files ${large.toFixed(2)} ms; cp -a of 100,000 files ${median('cp -a', 100_000).toFixed(0)} ms`,
          )
        }
        notes.push(
          `writing the files in the session (one shell turn): ${SIZES.map((s) => `${count(s)} ${fillMs[s].toFixed(0)} ms`).join(', ')}`,
        )
        return {
          config: {
            runs: RUNS,
            cpRuns: CP_RUNS,
            truncated,
            client: 'node:http keep-alive',
            sessions:
              'shell agent (each line run by bash), autoSnapshots: false, files written by a bash loop inside the session',
            measured:
              'request to response of POST /v1/sessions/{id}/snapshots, /restore {snapshotId}, /fork {snapshotId}; "warm sandbox": after a turn, so the snapshot freezes the sandbox and the restore stops it; floor: cp -a of the workspace to a directory on the same btrfs (then removed and synced, untimed)',
            fillMs,
          },
          rows: samples.rows(SIZES, OPS, 'cp -a'),
          targets,
          notes,
        }
      } finally {
        await server.close()
        await rm(project, { recursive: true, force: true })
      }
    }),
}
