import { appendFile, cp, mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { type Bench, progress, repeat } from './lib/bench.js'
import { machineInfo } from './lib/machine.js'
import type { BenchResult } from './lib/results.js'
import { EXAMPLES, packDir, startBenchServer } from './lib/server.js'
import { row } from './lib/stats.js'

const RUNS = 12

/**
 * Deploy to READY (`POST /v1/agents?wait=true`) of a Node project with npm dependencies: the
 * first deploy builds the environment (`npm ci` in a sandbox); a redeploy that only changes source
 * reuses it. The floor is a deploy of a project without dependencies.
 */
export const deploy: Bench = {
  name: 'deploy',
  description: 'deploy to READY: first build vs an unchanged-dependency redeploy',
  async run(): Promise<BenchResult> {
    const startedAt = new Date().toISOString()
    const t0 = performance.now()
    const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-bench-deploy-'))
    await cp(path.join(EXAMPLES, 'node-deps'), dir, { recursive: true })
    const server = await startBenchServer()
    try {
      const ready = async (project: string) => {
        const res = await server.http.json('POST', '/v1/agents?wait=true', await packDir(project))
        if (res.status !== 201 || res.body.revision.status !== 'READY') {
          throw new Error(`deploy failed: ${res.status} ${JSON.stringify(res.body)}`)
        }
        return res.ms
      }
      progress('first deploy (builds the npm environment)')
      const first = await ready(dir)
      const floor: number[] = []
      const redeploy: number[] = []
      progress(`${RUNS} redeploys with a source change, and ${RUNS} deploys without dependencies`)
      const { truncated } = await repeat(RUNS, 120_000, async (i) => {
        await appendFile(path.join(dir, 'agent.mjs'), `// revision ${i}\n`)
        redeploy.push(await ready(dir))
        floor.push(await ready(path.join(EXAMPLES, 'echo')))
      })
      const floorRow = row('deploy without dependencies (echo)', floor)
      const redeployRow = row('redeploy, unchanged package-lock.json', redeploy, {
        name: 'deploy without dependencies',
        median: floorRow.summary.median,
      })
      return {
        bench: 'deploy',
        startedAt,
        durationMs: performance.now() - t0,
        machine: machineInfo(),
        config: { runs: RUNS, truncated, project: 'examples/node-deps' },
        rows: [row('first deploy (npm ci in a sandbox)', [first]), redeployRow, floorRow],
        targets: [
          {
            name: 'unchanged-dependency redeploy READY (issue 3)',
            goal: 'median < 2000 ms',
            value: redeployRow.summary.median,
            met: redeployRow.summary.median < 2000,
          },
        ],
        notes: [`first deploy with npm ci: ${first.toFixed(0)} ms`],
      }
    } finally {
      await server.close()
      await rm(dir, { recursive: true, force: true })
    }
  },
}
