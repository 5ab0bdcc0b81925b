import { CairnProblem } from '@cairn/protocol'

/** Heavy reads (digests, exports, diffs and manifests, file downloads) a tenant may have running at once. */
export const HEAVY_READS_PER_TENANT = 2

/**
 * Per-tenant slots for reads that walk whole trees or stream whole files (digests, exports, diffs,
 * file downloads: a 500 GB sparse file streams zeros for as long as it is read): a tenant that asks
 * for more at once gets
 * `rate_limited` (429, retryable) instead of starving the host and the other tenants.
 */
export class HeavyReads {
  private readonly running = new Map<string, number>()

  constructor(private readonly perTenant = HEAVY_READS_PER_TENANT) {}

  /** Takes a slot or refuses; the returned release may be called any number of times. */
  acquire(tenantId: string, what: string): () => void {
    const count = this.running.get(tenantId) ?? 0
    if (count >= this.perTenant)
      throw new CairnProblem(
        'rate_limited',
        `${what} must wait: this tenant already has ${count} heavy reads (digests, exports, diffs, downloads) running (at most ${this.perTenant} at once); retry when one is done`,
        { limit: this.perTenant },
      )
    this.running.set(tenantId, count + 1)
    let released = false
    return () => {
      if (released) return
      released = true
      const left = (this.running.get(tenantId) ?? 1) - 1
      if (left > 0) this.running.set(tenantId, left)
      else this.running.delete(tenantId)
    }
  }

  /** Runs `work` in a slot. */
  async run<T>(tenantId: string, what: string, work: () => Promise<T>): Promise<T> {
    const release = this.acquire(tenantId, what)
    try {
      return await work()
    } finally {
      release()
    }
  }
}
