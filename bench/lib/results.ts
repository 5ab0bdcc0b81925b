import { mkdir, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { type MachineInfo, machineInfo } from './machine.js'
import { type Row, ratio } from './stats.js'

export const RESULTS_DIR = path.join(import.meta.dirname, '..', 'results')

/** A target from the issues, checked against a measured figure (a median, a p99 or a difference). */
export interface Target {
  name: string
  /** Human-readable goal, e.g. "median < 5 ms". */
  goal: string
  value: number
  met: boolean
  /** The unit of `value` when it is not milliseconds. */
  unit?: string
}

export interface BenchResult {
  bench: string
  startedAt: string
  durationMs: number
  machine: MachineInfo
  config: Record<string, unknown>
  rows: Row[]
  targets: Target[]
  notes: string[]
  /** Filled in by the harness: the code measured and how busy the machine was. */
  context?: { commit: string; modifiedPackageFiles: number; idlePctBefore: number }
}

const round = (v: number) => Math.round(v * 1000) / 1000

/** Writes `bench/results/<name>.json` (samples rounded to the microsecond). */
export async function writeResult(result: BenchResult): Promise<string> {
  await mkdir(RESULTS_DIR, { recursive: true })
  const file = path.join(RESULTS_DIR, `${result.bench}.json`)
  const rows = result.rows.map((r) => ({
    name: r.name,
    unit: r.unit,
    runs: r.summary.runs,
    medianMs: round(r.summary.median),
    p99Ms: round(r.summary.p99),
    minMs: round(r.summary.min),
    maxMs: round(r.summary.max),
    meanMs: round(r.summary.mean),
    floor: r.floor ? { name: r.floor.name, medianMs: round(r.floor.median) } : undefined,
    ratioToFloor: ratio(r) === undefined ? undefined : round(ratio(r) as number),
    note: r.note,
    samplesMs: r.samples?.map(round),
  }))
  await writeFile(
    file,
    `${JSON.stringify({ ...result, machine: result.machine ?? machineInfo(), rows }, null, 2)}\n`,
  )
  return file
}

export function printTargets(targets: readonly Target[]): void {
  if (targets.length === 0) return
  console.log('targets:')
  for (const t of targets)
    console.log(
      `  ${t.met ? 'MET   ' : 'MISSED'} ${t.name}: ${t.goal} (measured ${t.value.toFixed(2)} ${t.unit ?? 'ms'})`,
    )
}
