import type fc from 'fast-check'
import { Violation } from './client.js'
import type { Model, SessionModel } from './model.js'
import { checkInvariants, expectTyped, type Real } from './system.js'

/**
 * One generated step: an operation or a fault, applied to the system under test (`S`: any, or a
 * test bed's own for its faults) and to the model, followed by a check of every invariant.
 */
export abstract class Step<S extends Real = Real> implements fc.AsyncCommand<Model, S> {
  /** Faults are counted apart from operations. */
  protected readonly fault: boolean = false

  abstract readonly kind: string

  /** Whether the step can run on the model's state (fast-check skips it otherwise). */
  check(model: Readonly<Model>): boolean {
    return this.needsSession ? model.live().length > 0 : true
  }

  protected get needsSession(): boolean {
    return true
  }

  async run(model: Model, real: S): Promise<void> {
    real.stats.steps += 1
    real.stats.count(this.fault ? real.stats.faults : real.stats.operations, this.kind)
    real.trace.push(this.toString())
    try {
      await this.apply(model, real)
      await checkInvariants(model, real)
    } catch (error) {
      if (error instanceof Error) {
        error.message = `${error.message}\n  at step ${real.trace.length}: ${this.toString()}\n  steps: ${real.trace.join(' → ')}\n  log:\n${real.logTail(15)}`
      }
      throw error
    }
  }

  protected abstract apply(model: Model, real: S): Promise<void>

  abstract toString(): string
}

/**
 * A refusal of an operation the model expects to succeed: a violation, unless the session is one
 * retention may have deleted (410 session_deleted; the invariant check then asks its events).
 */
export function unexpected(
  session: SessionModel,
  what: string,
  answer: { status: number; body: unknown },
): void {
  const code = expectTyped(what, answer)
  if (answer.status === 410 && code === 'session_deleted' && session.retentionMayDelete) return
  throw new Violation(`${session.label} ${what}: refused ${answer.status} ${JSON.stringify(answer.body)}`)
}
