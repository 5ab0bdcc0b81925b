import { rm } from 'node:fs/promises'
import { floor } from './baselines.js'
import { type Bench, progress, repeat } from './lib/bench.js'
import { machineInfo } from './lib/machine.js'
import type { BenchResult } from './lib/results.js'
import { makeProject, startBenchServer } from './lib/server.js'
import { row } from './lib/stats.js'

const RUNS = 60
const WARMUP = 3
const SIZES = [10, 10_000] as const

/**
 * POST /v1/sessions for a project of 10 files and one of 10,000 files, alternating: creation must
 * not depend on the project's size.
 */
export const sessionCreate: Bench = {
  name: 'session-create',
  description: 'POST /v1/sessions for a 10-file vs a 10,000-file project',
  async run(): Promise<BenchResult> {
    const startedAt = new Date().toISOString()
    const t0 = performance.now()
    const floors = {
      10: await floor('snapshot ioctl (10 files)'),
      10000: await floor('snapshot ioctl (10,000 files)'),
    }
    const dirs: string[] = []
    const server = await startBenchServer()
    try {
      const agents: Record<number, string> = {}
      const deployMs: Record<number, number> = {}
      for (const size of SIZES) {
        progress(`deploying a ${size}-file project`)
        const dir = await makeProject(`files${size}`, size)
        dirs.push(dir)
        const deployed = await server.deploy(dir)
        agents[size] = deployed.agent
        deployMs[size] = deployed.ms
      }
      const samples: Record<number, number[]> = { 10: [], 10000: [] }
      const created: string[] = []
      const once = async (size: number, keep: boolean) => {
        const { id, ms } = await server.createSession(agents[size] as string)
        created.push(id)
        if (keep) samples[size]?.push(ms)
      }
      for (let i = 0; i < WARMUP; i++) for (const size of SIZES) await once(size, false)
      progress(`${RUNS} creations per project size, alternating (node:http keep-alive)`)
      const { truncated } = await repeat(RUNS, 90_000, async () => {
        for (const size of SIZES) await once(size, true)
      })
      // Deleted at the end, untimed: a btrfs subvolume delete leaves work to the kernel's cleaner
      // thread that would otherwise land on the next measurement.
      for (const id of created) await server.deleteSession(id)
      const rows = SIZES.map((size) =>
        row(
          `create session (${size.toLocaleString('en-US')} files)`,
          samples[size] as number[],
          floors[size],
        ),
      )
      const [small, large] = rows.map((r) => r.summary.median) as [number, number]
      // A btrfs snapshot is not quite the same for every tree: the kernel adds a reference to each
      // child of the source's root node (at most a few hundred). That step is the floor's; Cairn
      // must add nothing that grows with the project.
      const kernelStep = floors[10_000].median - floors[10].median
      const step = large - small
      return {
        bench: 'session-create',
        startedAt,
        durationMs: performance.now() - t0,
        machine: machineInfo(),
        config: {
          runs: RUNS,
          warmup: WARMUP,
          client: 'node:http keep-alive',
          measured:
            'POST /v1/sessions request to response end; the sessions are deleted (untimed) at the end',
          deployMs,
          truncated,
        },
        rows,
        targets: [
          {
            name: 'session creation independent of project size (issue 2)',
            goal: `create(10,000) - create(10) <= the kernel's own step (${kernelStep.toFixed(2)} ms) + 1 ms`,
            value: step,
            met: step <= kernelStep + 1,
          },
        ],
        notes: [
          `10,000 files vs 10 files: +${step.toFixed(2)} ms (x${(large / small).toFixed(2)}); the snapshot ioctl alone: +${kernelStep.toFixed(2)} ms`,
          `deploy (not a target here): 10 files ${deployMs[10]?.toFixed(0)} ms, 10,000 files ${deployMs[10_000]?.toFixed(0)} ms`,
        ],
      }
    } finally {
      await server.close()
      for (const dir of dirs) await rm(dir, { recursive: true, force: true })
    }
  },
}
