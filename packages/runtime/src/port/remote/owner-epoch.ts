import { AsyncLocalStorage } from 'node:async_hooks'

const ownerEpoch = new AsyncLocalStorage<number>()

/**
 * Runs `fn` as the owner of a session at `epoch` (its `owner_epoch` in the cluster's database):
 * every remote runtime call made inside carries it (header `cairn-owner-epoch`), and a node that
 * has seen a higher epoch for the session refuses the call (`stale_epoch`).
 */
export function runWithOwnerEpoch<T>(epoch: number, fn: () => T): T {
  return ownerEpoch.run(epoch, fn)
}

/** The owner epoch the current call runs under, if any (see `runWithOwnerEpoch`). */
export function currentOwnerEpoch(): number | undefined {
  return ownerEpoch.getStore()
}

/**
 * The highest owner epoch a node has seen per session: a call under a lower one comes from an
 * owner that lost the session since, and a session-keyed call without one is not an owner's.
 */
export class EpochFence {
  private readonly highest = new Map<string, number>()

  /** Why the call must be refused, or undefined (the epoch is then the session's highest). */
  admit(sessionId: string, epoch: number | undefined): string | undefined {
    if (epoch === undefined) return `a call for session ${sessionId} must carry its owner epoch`
    const seen = this.highest.get(sessionId)
    if (seen !== undefined && epoch < seen)
      return `session ${sessionId} is owned at epoch ${seen} now; this call came at epoch ${epoch}`
    if (seen === undefined || epoch > seen) this.highest.set(sessionId, epoch)
    return undefined
  }
}
