import type { BenchResult } from './results.js'

export interface Bench {
  name: string
  description: string
  run(): Promise<BenchResult>
}

/**
 * Runs `fn` `runs` times, stopping early (and saying so) once `budgetMs` has passed, so no bench
 * can run away with the machine.
 */
export async function repeat(
  runs: number,
  budgetMs: number,
  fn: (i: number) => Promise<void>,
): Promise<{ done: number; truncated: boolean }> {
  const deadline = performance.now() + budgetMs
  for (let i = 0; i < runs; i++) {
    if (performance.now() > deadline) {
      console.warn(`  (stopped after ${i} of ${runs} runs: time budget of ${budgetMs} ms reached)`)
      return { done: i, truncated: true }
    }
    await fn(i)
  }
  return { done: runs, truncated: false }
}

export function progress(label: string): void {
  process.stderr.write(`  ${label}\n`)
}
