import { CairnProblem } from '@cairn/protocol'
import { expect } from 'vitest'

/** The CairnProblem a promise rejects with (a resolution, or any other error, fails the test). */
export async function rejection(promise: Promise<unknown>): Promise<CairnProblem> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  )
  expect(error).toBeInstanceOf(CairnProblem)
  return error as CairnProblem
}

/** The promise, or a rejection (not a CairnProblem) once `boundMs` passed without it settling. */
export function within<T>(promise: Promise<T>, boundMs: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`still waiting after ${boundMs} ms`)), boundMs)
  })
  return Promise.race([promise, late]).finally(() => clearTimeout(timer))
}
