/**
 * Prints bench/results/*.json as Markdown tables, for docs/benchmarks/*.md:
 *   node --import tsx bench/report.ts [name …]
 */
import { existsSync, readFileSync } from 'node:fs'
import path from 'node:path'
import { describeMachine } from './lib/machine.js'
import { type BenchResult, RESULTS_DIR } from './lib/results.js'
import { fmtMs, fmtRatio, label } from './lib/stats.js'

interface StoredRow {
  name: string
  unit?: string
  runs: number
  medianMs: number
  p99Ms: number
  minMs: number
  floor?: { name: string; medianMs: number }
  ratioToFloor?: number
}

const names = process.argv.slice(2)
const order =
  names.length > 0
    ? names
    : [
        'baselines',
        'session-create',
        'cold-start',
        'warm-turn',
        'deploy',
        'snapshots',
        'idle-memory',
        'scale',
        'throughput',
      ]
for (const name of order) {
  const file = path.join(RESULTS_DIR, `${name}.json`)
  if (!existsSync(file)) continue
  const result = JSON.parse(readFileSync(file, 'utf8')) as Omit<BenchResult, 'rows'> & { rows: StoredRow[] }
  console.log(`### ${name}\n`)
  console.log(
    `${result.startedAt.slice(0, 16).replace('T', ' ')} UTC, ${(result.durationMs / 1000).toFixed(0)} s; ${describeMachine(result.machine)}` +
      (result.context
        ? `; code ${result.context.commit} (+${result.context.modifiedPackageFiles} modified files), CPUs ${result.context.idlePctBefore}% idle before`
        : ''),
  )
  console.log('\n| figure | median ms | p99 ms | min ms | runs | floor (median ms) | × floor |')
  console.log('|---|---:|---:|---:|---:|---|---:|')
  for (const r of result.rows) {
    const floor = r.floor ? `${r.floor.name} (${fmtMs(r.floor.medianMs)})` : ''
    const ratio = r.ratioToFloor === undefined ? '' : `${fmtRatio(r.ratioToFloor)}×`
    console.log(
      `| ${label(r)} | ${fmtMs(r.medianMs)} | ${fmtMs(r.p99Ms)} | ${fmtMs(r.minMs)} | ${r.runs} | ${floor} | ${ratio} |`,
    )
  }
  if (result.notes.length > 0) console.log(`\n${result.notes.map((note) => `- ${note}`).join('\n')}`)
  if (result.targets.length > 0) {
    console.log('\n| target | goal | measured (ms unless noted) | |')
    console.log('|---|---|---:|---|')
    for (const t of result.targets)
      console.log(
        `| ${t.name} | ${t.goal} | ${fmtMs(t.value)}${t.unit ? ` ${t.unit}` : ''} | ${t.met ? 'met' : '**missed**'} |`,
      )
  }
  console.log('')
}
