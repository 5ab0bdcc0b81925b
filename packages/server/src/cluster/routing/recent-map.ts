/**
 * A map whose entries are forgotten `ttlMs` after they were set: what this replica decided a
 * moment ago (a session placed but not yet recorded, a snapshot taken but not yet in its table),
 * until the database says it too.
 */
export class RecentMap<K, V> {
  private readonly entries = new Map<K, { value: V; atMs: number }>()

  constructor(
    private readonly ttlMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  get(key: K): V | undefined {
    const entry = this.entries.get(key)
    if (!entry) return undefined
    if (this.now() - entry.atMs >= this.ttlMs) {
      this.entries.delete(key)
      return undefined
    }
    return entry.value
  }

  set(key: K, value: V): void {
    this.entries.delete(key)
    this.entries.set(key, { value, atMs: this.now() })
    // Oldest first: the sweep stops at the first live entry.
    for (const [k, entry] of this.entries) {
      if (this.now() - entry.atMs < this.ttlMs) break
      this.entries.delete(k)
    }
  }

  delete(key: K): void {
    this.entries.delete(key)
  }
}
