/** Small statistics and table helpers shared by every bench. All times are in milliseconds. */

export interface Summary {
  runs: number
  median: number
  p99: number
  min: number
  max: number
  mean: number
}

export function summarize(samples: readonly number[]): Summary {
  if (samples.length === 0)
    return {
      runs: 0,
      median: Number.NaN,
      p99: Number.NaN,
      min: Number.NaN,
      max: Number.NaN,
      mean: Number.NaN,
    }
  const sorted = [...samples].sort((a, b) => a - b)
  const n = sorted.length
  const mid = Math.floor(n / 2)
  const median =
    n % 2 === 1 ? (sorted[mid] as number) : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2
  // Nearest-rank percentile: with fewer than 100 runs p99 is the maximum.
  const p99 = sorted[Math.min(n - 1, Math.ceil(0.99 * n) - 1)] as number
  const mean = sorted.reduce((sum, v) => sum + v, 0) / n
  return { runs: n, median, p99, min: sorted[0] as number, max: sorted[n - 1] as number, mean }
}

/** One line of a bench's table: a measured figure and, where there is one, the floor it is compared to. */
export interface Row {
  name: string
  summary: Summary
  /** What the figure is compared to (a baseline measured in the same run), by its median. */
  floor?: { name: string; median: number } | undefined
  note?: string | undefined
  samples?: readonly number[] | undefined
  /** What the figures count when they are not milliseconds (e.g. `MiB`, `turns/s`). */
  unit?: string | undefined
}

/** A row's name, with its unit when it is not milliseconds. */
export function label(r: { name: string; unit?: string | undefined }): string {
  return r.unit ? `${r.name} [${r.unit}]` : r.name
}

export function row(
  name: string,
  samples: readonly number[],
  floor?: { name: string; median: number },
  note?: string,
): Row {
  return { name, summary: summarize(samples), floor, note, samples }
}

export function ratio(r: Row): number | undefined {
  if (!r.floor || !(r.floor.median > 0)) return undefined
  return r.summary.median / r.floor.median
}

export function fmtMs(ms: number): string {
  if (!Number.isFinite(ms)) return '-'
  if (ms >= 100) return ms.toFixed(0)
  if (ms >= 10) return ms.toFixed(1)
  return ms.toFixed(2)
}

/** A ratio to a floor: one decimal, or one significant digit below 0.1 (a copy against a snapshot). */
export function fmtRatio(x: number): string {
  return x >= 0.1 ? x.toFixed(1) : x.toPrecision(1)
}

/** Prints a fixed-width table: name, median, p99, min, runs, floor and ratio. */
export function printTable(title: string, rows: readonly Row[]): string {
  const header = ['figure (ms unless [unit])', 'median', 'p99', 'min', 'runs', 'floor', 'x floor']
  const lines = rows.map((r) => {
    const x = ratio(r)
    return [
      label(r),
      fmtMs(r.summary.median),
      fmtMs(r.summary.p99),
      fmtMs(r.summary.min),
      String(r.summary.runs),
      r.floor ? `${r.floor.name} (${fmtMs(r.floor.median)})` : '',
      x === undefined ? '' : `${fmtRatio(x)}x`,
    ]
  })
  const widths = header.map((h, i) => Math.max(h.length, ...lines.map((l) => (l[i] as string).length)))
  const fmt = (cells: string[]) =>
    cells
      .map((c, i) => (i === 0 || i === 5 ? c.padEnd(widths[i] as number) : c.padStart(widths[i] as number)))
      .join('  ')
  const out = [`\n${title}`, fmt(header), widths.map((w) => '-'.repeat(w)).join('  '), ...lines.map(fmt)]
  const notes = rows.filter((r) => r.note).map((r) => `  * ${r.name}: ${r.note}`)
  const text = [...out, ...notes].join('\n')
  console.log(text)
  return text
}

/** A high-resolution stopwatch. */
export function now(): number {
  return performance.now()
}

export async function time(fn: () => Promise<unknown>): Promise<number> {
  const start = performance.now()
  await fn()
  return performance.now() - start
}
