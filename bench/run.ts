/**
 * The bench harness: `npm run bench -- <name> [<name> …]` or `npm run bench -- all`.
 * Each bench prints a table (median, p99, min, runs, ratio to its floor) and writes
 * bench/results/<name>.json. Build first (`npx tsc -b`): the benches measure packages/*\/dist.
 */
import { existsSync, readFileSync } from 'node:fs'
import path from 'node:path'
import type { Bench } from './lib/bench.js'
import { codeVersion, describeMachine, machineInfo } from './lib/machine.js'
import { printTargets, writeResult } from './lib/results.js'
import { printTable } from './lib/stats.js'

const DIST = path.join(import.meta.dirname, '..', 'packages', 'server', 'dist', 'index.js')

async function load(): Promise<Bench[]> {
  const [
    { baselines },
    { sessionCreate },
    { coldStart },
    { warmTurn },
    { deploy },
    { snapshots },
    { idleMemory },
    { scale },
    { throughput },
    { storageDir },
    { previews },
    { gvisorStart },
    { gvisorPlatforms },
    { drivers },
    { cli },
    { pause },
    { forkMemory },
    { images },
    { databases },
    { remotePort },
    { shipping },
    { cluster },
    { recovery },
    { moves },
    { turnStatements },
    { commands },
    { warmTurnProcess },
    { hop },
    { density },
    { tenantAtLimits },
  ] = await Promise.all([
    import('./baselines.js'),
    import('./session-create.js'),
    import('./cold-start.js'),
    import('./warm-turn.js'),
    import('./deploy.js'),
    import('./snapshots.js'),
    import('./idle-memory.js'),
    import('./scale.js'),
    import('./throughput.js'),
    import('./storage-dir.js'),
    import('./previews.js'),
    import('./gvisor-start.js'),
    import('./gvisor-platforms.js'),
    import('./drivers.js'),
    import('./cli.js'),
    import('./pause.js'),
    import('./fork-memory.js'),
    import('./images.js'),
    import('./databases.js'),
    import('./remote-port.js'),
    import('./shipping.js'),
    import('./cluster.js'),
    import('./recovery.js'),
    import('./moves.js'),
    import('./turn-statements.js'),
    import('./commands.js'),
    import('./warm-turn-process.js'),
    import('./hop.js'),
    import('./density.js'),
    import('./tenant-at-limits.js'),
  ])
  return [
    baselines,
    sessionCreate,
    coldStart,
    warmTurn,
    deploy,
    snapshots,
    idleMemory,
    scale,
    throughput,
    storageDir,
    previews,
    gvisorStart,
    gvisorPlatforms,
    drivers,
    cli,
    pause,
    forkMemory,
    images,
    databases,
    remotePort,
    shipping,
    cluster,
    recovery,
    moves,
    turnStatements,
    commands,
    warmTurnProcess,
    hop,
    density,
    tenantAtLimits,
  ]
}

/** Share of CPU time spent idle over `ms`, from /proc/stat. */
async function idlePercent(ms: number): Promise<number> {
  const sample = () => {
    const cpu = (readFileSync('/proc/stat', 'utf8').split('\n')[0] as string)
      .trim()
      .split(/\s+/)
      .slice(1)
      .map(Number)
    const idle = (cpu[3] ?? 0) + (cpu[4] ?? 0)
    return { idle, total: cpu.reduce((a, b) => a + b, 0) }
  }
  const a = sample()
  await new Promise((r) => setTimeout(r, ms))
  const b = sample()
  return b.total > a.total ? (100 * (b.idle - a.idle)) / (b.total - a.total) : 100
}

async function main(): Promise<number> {
  const args = process.argv.slice(2)
  if (!existsSync(DIST)) {
    console.error('packages/server/dist is missing: build first with `npx tsc -b` at the repository root')
    return 2
  }
  const benches = await load()
  const usage = () => {
    console.error('usage: npm run bench -- <name>… | all')
    for (const b of benches) console.error(`  ${b.name.padEnd(16)} ${b.description}`)
  }
  if (args.length === 0 || args.includes('--help') || args.includes('-h')) {
    usage()
    return args.length === 0 ? 2 : 0
  }
  const selected = args.includes('all') ? benches : args.map((name) => benches.find((b) => b.name === name))
  if (selected.some((b) => b === undefined)) {
    console.error(`unknown bench: ${args.filter((a) => !benches.some((b) => b.name === a)).join(', ')}`)
    usage()
    return 2
  }
  if (process.getuid?.() !== 0) console.warn('warning: the benches need root (btrfs loop mounts, cgroups)')
  console.log(`machine: ${describeMachine(machineInfo())}`)
  const code = codeVersion()
  console.log(
    `code: ${code.commit}, ${code.modifiedPackageFiles} modified files under packages/ (measuring their dist)`,
  )
  let failed = 0
  for (const bench of selected as Bench[]) {
    console.log(`\n== ${bench.name}: ${bench.description}`)
    // Whatever else runs on the machine shows up in the figures: look before starting.
    const idle = await idlePercent(1000)
    if (idle < 90)
      console.warn(
        `  warning: the CPUs were only ${idle.toFixed(0)}% idle before this bench: figures will be noisy`,
      )
    try {
      const result = await bench.run()
      result.context = { ...code, idlePctBefore: Math.round(idle) }
      printTable(`${bench.name} (${(result.durationMs / 1000).toFixed(1)} s)`, result.rows)
      for (const note of result.notes) console.log(`  ${note}`)
      printTargets(result.targets)
      const file = await writeResult(result)
      console.log(`wrote ${path.relative(process.cwd(), file)}`)
    } catch (error) {
      failed++
      console.error(`bench ${bench.name} failed:`, error)
    }
  }
  return failed > 0 ? 1 : 0
}

process.exitCode = await main()
