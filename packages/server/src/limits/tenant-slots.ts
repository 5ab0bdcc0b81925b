import { CairnProblem } from '@cairn/protocol'

/**
 * A count per tenant with a cap, taken synchronously (concurrent requests cannot pass it together)
 * and given back by the function `take` answers.
 */
export class TenantSlots {
  private readonly taken = new Map<string, number>()

  constructor(
    /** What is counted, for the message: `builds`. */
    private readonly what: string,
    /** The operator limit's name and where it is set, for the message and details. */
    private readonly limit: { name: string; source: string },
    private readonly cap: () => number,
  ) {}

  inUse(tenantId: string): number {
    return this.taken.get(tenantId) ?? 0
  }

  /** A slot of the tenant, or `sandbox_limit_reached` (retryable) when all are taken. */
  take(tenantId: string): () => void {
    const now = this.inUse(tenantId)
    const cap = this.cap()
    if (now >= cap)
      throw new CairnProblem(
        'sandbox_limit_reached',
        `this tenant has ${now} ${this.what} running, the most this server allows (${cap}, ${this.limit.source}): retry when one ends`,
        { limit: this.limit.name, value: now, ceiling: cap },
      )
    this.taken.set(tenantId, now + 1)
    let given = false
    return () => {
      if (given) return
      given = true
      const left = this.inUse(tenantId) - 1
      if (left <= 0) this.taken.delete(tenantId)
      else this.taken.set(tenantId, left)
    }
  }
}
