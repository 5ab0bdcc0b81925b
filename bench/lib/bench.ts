import { machineInfo } from './machine.js'
import type { BenchResult } from './results.js'

export interface Bench {
  name: string
  description: string
  run(): Promise<BenchResult>
}

/** What a bench's body returns; `timedResult` adds its name, start time, duration and the machine. */
export type BenchBody = Omit<BenchResult, 'bench' | 'startedAt' | 'durationMs' | 'machine' | 'context'>

/** Runs a bench's body and completes what it returns into the bench's result. */
export async function timedResult(bench: string, body: () => Promise<BenchBody>): Promise<BenchResult> {
  const startedAt = new Date().toISOString()
  const t0 = performance.now()
  const result = await body()
  return { bench, startedAt, durationMs: performance.now() - t0, machine: machineInfo(), ...result }
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

/**
 * Runs `fn(0)` … `fn(count - 1)` with at most `concurrency` in flight; the first error stops
 * new starts and is thrown once those in flight have settled.
 */
export async function concurrently(
  count: number,
  concurrency: number,
  fn: (i: number) => Promise<void>,
): Promise<void> {
  let next = 0
  let failure: unknown
  const worker = async () => {
    while (failure === undefined && next < count) {
      const i = next++
      try {
        await fn(i)
      } catch (error) {
        failure ??= error
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(concurrency, count) }, worker))
  if (failure !== undefined) throw failure
}

/** Waits until `check()` holds (true) or `timeoutMs` has passed (false). */
export async function waitFor(check: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = performance.now() + timeoutMs
  while (!check()) {
    if (performance.now() > deadline) return false
    await new Promise((r) => setTimeout(r, 20))
  }
  return true
}

export function progress(label: string): void {
  process.stderr.write(`  ${label}\n`)
}
