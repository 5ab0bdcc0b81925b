import { AsyncLocalStorage } from 'node:async_hooks'

const ownerEpoch = new AsyncLocalStorage<number>()

/**
 * Runs `fn` with the session's owner epoch in its async context: a remote port sends it with
 * every call made inside (header `cairn-owner-epoch`), and a node that has seen a newer owner of
 * the session refuses the call (`stale_epoch`).
 */
export function runWithOwnerEpoch<T>(epoch: number, fn: () => T): T {
  return ownerEpoch.run(epoch, fn)
}

/** The owner epoch of the calls made now (undefined outside `runWithOwnerEpoch`). */
export function currentOwnerEpoch(): number | undefined {
  return ownerEpoch.getStore()
}
