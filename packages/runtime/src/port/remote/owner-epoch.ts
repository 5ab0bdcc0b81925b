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
 * Where a session's owner epoch stands outside this process (the cluster's database): the fence
 * starts a session from it, so a node that restarted (and forgot every epoch it had seen) still
 * refuses a call under an epoch the session has left. Undefined: the session is not known there
 * (yet: a new session's first calls come before its row names its node).
 */
export type EpochFloor = (sessionId: string) => Promise<number | undefined>

/**
 * The highest owner epoch a node has seen per session: a call under a lower one comes from an
 * owner that lost the session since, and a session-keyed call without one is not an owner's. The
 * first call of a session in this process is also held to the `floor` (the database's epoch), not
 * only to what this process saw.
 */
export class EpochFence {
  private readonly highest = new Map<string, number>()

  constructor(private readonly floor?: EpochFloor | undefined) {}

  /** Why the call must be refused, or undefined (the epoch is then the session's highest). */
  async admit(sessionId: string, epoch: number | undefined): Promise<string | undefined> {
    if (epoch === undefined) return `a call for session ${sessionId} must carry its owner epoch`
    if (!this.highest.has(sessionId) && this.floor) {
      const floor = await this.floor(sessionId)
      // Another call may have raised it while the floor was read: the higher of both stands.
      if (floor !== undefined && floor > (this.highest.get(sessionId) ?? -1))
        this.highest.set(sessionId, floor)
    }
    const seen = this.highest.get(sessionId)
    if (seen !== undefined && epoch < seen)
      return `session ${sessionId} is owned at epoch ${seen} now; this call came at epoch ${epoch}`
    if (seen === undefined || epoch > seen) this.highest.set(sessionId, epoch)
    return undefined
  }
}
