import type { Clock } from '../clock.js'
import {
  RESERVATION_LEASE_MS,
  type StorageBudget,
  type StorageReservation,
  TURNS_PURPOSE,
} from './storage-budget.js'

/** The most a process holds for one tenant's turns at once (one reservation, drawn from in memory). */
export const TURN_ALLOWANCE_MAX_BYTES = 1024 * 1024
/** Of the room the tenant has left, the share an allowance may take (the rest stays for its other stores). */
const ROOM_SHARE = 8
/** An allowance is replaced (its figures read again) after this long, and renewed while turns draw on it. */
const REFRESH_MS = RESERVATION_LEASE_MS / 3

/** A turn's share of its tenant's allowance, handed back as it ends. */
export interface TurnDraw {
  /** The turn ended: `keptBytes` of what it drew were written (counted by the tenant's counters now). */
  end(keptBytes: number): void
}

interface Allowance {
  tenantId: string
  reservation: StorageReservation
  /** Reserved and neither drawn nor written. */
  leftBytes: number
  /** Drawn by turns still running. */
  drawnBytes: number
  refreshAtMs: number
  renewal?: NodeJS.Timeout | undefined
}

/**
 * Admits a turn's writes (its prompt, its end up to the unreserved bound) against its tenant's
 * storage budget before any sandbox work. Each process holds, per tenant with turns, one
 * reservation in the budget (`StorageBudget.reserve`: every replica sees it), up to
 * `TURN_ALLOWANCE_MAX_BYTES` and at most an eighth of the room the tenant has left, at least the
 * turn's need; turns draw on it in memory, so a warm turn takes no statement of its own. It is
 * replaced (released and reserved again in one transaction, the budget's figures read again) when
 * a turn needs more than is left or after `REFRESH_MS`; renewed while turns draw on it; it lapses
 * `RESERVATION_LEASE_MS` after the tenant's last turn ends. What turns wrote stays counted in the
 * reservation as well as in the tenant's counters until it is replaced: the budget counts up to
 * one allowance more than is kept, never less. Another of the tenant's reservations refused in this
 * process (its turn's events, an artifact) first has the allowance given back whole, then is tried
 * again.
 */
export class TurnAdmission {
  private readonly allowances = new Map<string, Allowance>()
  /** One replacement at a time per tenant: concurrent turns wait for it, then draw. */
  private readonly replacing = new Map<string, Promise<unknown>>()

  constructor(private readonly deps: { budget: StorageBudget; clock: Clock }) {
    deps.budget.onShort((tenantId) => this.giveBack(tenantId))
  }

  /**
   * Another reservation of the tenant's was refused: the allowance gives back all it holds, what
   * running turns drew included, and the next turn replaces it. What turns wrote is in the
   * counters already; a running turn's end (at most `END_UNRESERVED_BYTES`) is written whatever is
   * held for it and counted once written, as every end was before turns were admitted. Keeping the
   * running turns' draws refused their own events: a turn whose agent wrote the tenant's pool to
   * within 24 KiB of its quota held 64 KiB for its end, and its next 163-byte events batch failed
   * the turn `quota_exceeded` (test/persist.test.ts › counts persisted paths in the tenant's quota,
   * in a clean-clone run).
   */
  private async giveBack(tenantId: string): Promise<boolean> {
    const allowance = this.allowances.get(tenantId)
    if (!allowance || this.replacing.has(tenantId) || allowance.reservation.bytes <= 0) return false
    allowance.leftBytes = 0
    allowance.refreshAtMs = 0
    await this.deps.budget.shrink(allowance.reservation, 0)
    return true
  }

  /**
   * Admits `bytes` for the tenant's turn, or refuses it with `quota_exceeded` (the budget's own
   * error, naming what the tenant holds). Undefined: no tenant quota, nothing is counted ahead.
   */
  async admit(tenantId: string, bytes: number): Promise<TurnDraw | undefined> {
    if (this.deps.budget.tenantBytes === undefined) return undefined
    for (;;) {
      const pending = this.replacing.get(tenantId)
      if (pending) {
        await pending.catch(() => undefined)
        continue
      }
      const allowance = this.allowances.get(tenantId)
      if (allowance && allowance.leftBytes >= bytes && this.deps.clock.now() < allowance.refreshAtMs)
        return this.draw(allowance, bytes)
      const replaced = this.replace(tenantId, allowance, bytes)
      this.replacing.set(tenantId, replaced)
      try {
        return this.draw(await replaced, bytes)
      } finally {
        this.replacing.delete(tenantId)
      }
    }
  }

  /** A new reservation for the tenant's turns: what running turns drew, and room for `bytes` more. */
  private async replace(tenantId: string, old: Allowance | undefined, bytes: number): Promise<Allowance> {
    const drawnBytes = old?.drawnBytes ?? 0
    const reservation = await this.deps.budget.reserve(tenantId, drawnBytes + bytes, TURNS_PURPOSE, {
      replacing: old?.reservation,
      upTo: (roomBytes) =>
        drawnBytes +
        Math.max(bytes, Math.min(TURN_ALLOWANCE_MAX_BYTES, Math.floor((roomBytes ?? 0) / ROOM_SHARE))),
    })
    if (old?.renewal) clearInterval(old.renewal)
    const allowance: Allowance = {
      tenantId,
      reservation,
      leftBytes: reservation.bytes - drawnBytes,
      drawnBytes,
      refreshAtMs: this.deps.clock.now() + REFRESH_MS,
    }
    this.allowances.set(tenantId, allowance)
    if (drawnBytes > 0) this.keepRenewed(allowance)
    return allowance
  }

  private draw(allowance: Allowance, bytes: number): TurnDraw {
    allowance.leftBytes -= bytes
    allowance.drawnBytes += bytes
    this.keepRenewed(allowance)
    let ended = false
    return {
      end: (keptBytes) => {
        if (ended) return
        ended = true
        allowance.drawnBytes -= bytes
        // What was written is counted by the tenant's counters now; the rest is free again.
        allowance.leftBytes += bytes - Math.min(bytes, Math.max(0, keptBytes))
        if (allowance.drawnBytes === 0 && allowance.renewal) {
          clearInterval(allowance.renewal)
          allowance.renewal = undefined
        }
      },
    }
  }

  /** Renews the reservation while turns draw on it (a turn may outlast its lease). */
  private keepRenewed(allowance: Allowance): void {
    if (allowance.renewal) return
    allowance.renewal = setInterval(() => {
      void this.deps.budget.renew(allowance.reservation).catch(() => undefined)
    }, REFRESH_MS)
    allowance.renewal.unref()
  }

  /**
   * Releases this process's allowances (the server's close, once its turns are over): left to
   * lapse, each stayed counted against its tenant for up to `RESERVATION_LEASE_MS` after the
   * process had gone, and was never removed from the database.
   */
  async close(): Promise<void> {
    await Promise.allSettled(this.replacing.values())
    const allowances = [...this.allowances.values()]
    this.allowances.clear()
    for (const allowance of allowances) {
      if (allowance.renewal) clearInterval(allowance.renewal)
      await this.deps.budget.release(allowance.reservation)
    }
  }
}
