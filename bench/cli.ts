import { spawn } from 'node:child_process'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { type Bench, progress, timedResult } from './lib/bench.js'
import type { Target } from './lib/results.js'
import { EXAMPLES, REPO_ROOT, startBenchServer } from './lib/server.js'
import { type Row, row } from './lib/stats.js'

/** The binary measured: this checkout's, or another's (`BENCH_CLI_BIN`, e.g. a before/after pair). */
const CLI_BIN = process.env.BENCH_CLI_BIN ?? path.join(REPO_ROOT, 'packages/cli/bin/cairn.js')
/**
 * Another checkout's binary (`BENCH_CLI_BASELINE`, e.g. main's before a change), measured in the same
 * loop, run for run, so a before/after pair shares the machine's load. Each binary gets its own
 * code-cache directory: a bin removes the caches of other bundles it finds in its directory.
 */
const BASELINE_BIN = process.env.BENCH_CLI_BASELINE
const RUNS = 20
/** The target of issue 21: a command that makes one request starts within 1.5x a bare `node -e 0`. */
const TARGET_RATIO = 1.5

/** Wall time of one process, spawn to exit; throws unless it exits 0. */
function timeProcess(args: string[], env: NodeJS.ProcessEnv): Promise<number> {
  return new Promise((resolve, reject) => {
    const start = performance.now()
    const child = spawn(process.execPath, args, { env, stdio: ['ignore', 'ignore', 'pipe'] })
    let stderr = ''
    child.stderr.setEncoding('utf8').on('data', (c: string) => {
      stderr += c
    })
    child.on('error', reject)
    child.on('close', (code) => {
      if (code === 0) resolve(performance.now() - start)
      else reject(new Error(`node ${args.join(' ')} exited ${code}: ${stderr}`))
    })
  })
}

/**
 * Start-up of the `cairn` binary, each command beside a bare `node -e 0` measured interleaved with it
 * (run for run, so that load on the machine lands on both): `--version` (no request), `sessions
 * list` (one request) and `run --single` in a warm session (one turn: create nothing, one message).
 */
export const cli: Bench = {
  name: 'cli',
  description: 'cairn CLI start-up: --version, sessions list, run --single, beside node -e 0',
  run: () =>
    timedResult('cli', async () => {
      const server = await startBenchServer()
      try {
        await server.deploy(`${EXAMPLES}/echo`)
        const session = await server.createSession('echo', { keepWarmMs: 10 * 60_000 })
        const env: NodeJS.ProcessEnv = {
          ...process.env,
          NO_COLOR: '1',
          CAIRN_API_URL: server.url,
          CAIRN_API_KEY: server.key,
        }
        const cacheDirs = [await mkdtemp(path.join(os.tmpdir(), 'cairn-bench-cli-'))]
        env.XDG_CACHE_HOME = cacheDirs[0]
        const baselineEnv = BASELINE_BIN
          ? { ...env, XDG_CACHE_HOME: await mkdtemp(path.join(os.tmpdir(), 'cairn-bench-cli-')) }
          : undefined
        if (baselineEnv?.XDG_CACHE_HOME) cacheDirs.push(baselineEnv.XDG_CACHE_HOME)
        try {
          const commands: Array<[string, string[]]> = [
            ['cairn --version', ['--version']],
            ['cairn sessions list', ['sessions', 'list']],
            ['cairn run --single (warm session)', ['run', 'echo', '--session', session.id, '--single', 'hi']],
          ]
          // One turn first, so the session's sandbox is warm for the runs measured.
          await timeProcess([CLI_BIN, ...(commands[2] as [string, string[]])[1]], env)
          if (BASELINE_BIN && baselineEnv)
            await timeProcess([BASELINE_BIN, ...(commands[2] as [string, string[]])[1]], baselineEnv)
          const rows: Row[] = []
          const targets: Target[] = []
          for (const [name, args] of commands) {
            progress(`${name} x ${RUNS}, interleaved with node -e 0`)
            const floorSamples: number[] = []
            const samples: number[] = []
            const baselineSamples: number[] = []
            for (let i = 0; i < RUNS; i++) {
              floorSamples.push(await timeProcess(['-e', '0'], env))
              samples.push(await timeProcess([CLI_BIN, ...args], env))
              if (BASELINE_BIN && baselineEnv)
                baselineSamples.push(await timeProcess([BASELINE_BIN, ...args], baselineEnv))
            }
            const floorRow = row(`node -e 0 (beside ${name})`, floorSamples)
            if (BASELINE_BIN)
              rows.push(
                row(`${name} (baseline: ${BASELINE_BIN})`, baselineSamples, {
                  name: 'node -e 0',
                  median: floorRow.summary.median,
                }),
              )
            const r = row(name, samples, { name: 'node -e 0', median: floorRow.summary.median })
            rows.push(floorRow, r)
            const x = r.summary.median / floorRow.summary.median
            if (name !== 'cairn run --single (warm session)')
              targets.push({
                name,
                goal: `median <= ${TARGET_RATIO}x node -e 0`,
                value: x,
                met: x <= TARGET_RATIO,
                unit: 'x',
              })
          }
          return {
            config: {
              ...(BASELINE_BIN ? { baseline: BASELINE_BIN } : {}),
              runs: RUNS,
              targetRatio: TARGET_RATIO,
              agent: 'echo',
              measured: `spawn to exit of node ${path.relative(REPO_ROOT, CLI_BIN)}`,
            },
            rows,
            targets,
            notes: ['run --single includes the turn itself (the echo agent in a warm sandbox)'],
          }
        } finally {
          for (const dir of cacheDirs) await rm(dir, { recursive: true, force: true })
        }
      } finally {
        await server.close()
      }
    }),
}
