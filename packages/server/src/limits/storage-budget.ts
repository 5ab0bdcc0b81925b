import { CairnProblem, KEPT_ENDED_COMMANDS, newId } from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import { sql } from 'kysely'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'

/** How long a reservation holds without a renewal: a copy renews it every third of this. */
export const RESERVATION_LEASE_MS = 60_000
/** First key of the PostgreSQL advisory lock that serialises one tenant's reservations. */
const TENANT_LOCK_KEY = 7_302_118

export interface StorageReservation {
  id: string
  tenantId: string
  bytes: number
}

interface ReserveOptions {
  upTo?: (roomBytes: number | undefined) => number
  replacing?: StorageReservation | undefined
}

/** What a tenant holds against its quota, in bytes. */
export interface TenantHeld {
  /** The tenant's trees in the pool (exclusive bytes, every node together). */
  poolBytes: number
  artifactBytes: number
  /** The output logs of its commands (see `commandLogUsage`). */
  commandLogBytes: number
  /** The stored stream events of its turns (kept until retention's turn-events layer deletes them). */
  turnEventBytes: number
  /** Its turns' prompts, responses and stderr: the transcripts (kept until the session's transcript is deleted). */
  turnTextBytes: number
  /** Space held for work under way (copies not yet settled). */
  reservedBytes: number
}

/**
 * One storage budget per tenant: the tenant quota the pool enforces on the tenant's trees also
 * covers what Cairn keeps for it beside the pool (artifacts, command logs, turn events, transcripts). Space is reserved before a copy
 * starts, in the database under a per-tenant lock, so concurrent requests (in this process or on
 * any replica) see each other's reservations and cannot each pass the same check; the copy then
 * settles its reservation into the row it writes, or releases it.
 */
export class StorageBudget {
  /** Who can give room back when a reservation is refused (the turns' allowances of this process). */
  private readonly givers: ((tenantId: string) => Promise<boolean>)[] = []

  constructor(
    private readonly deps: {
      db: Db
      runtime: Pick<RuntimePort, 'tenantUsage'>
      clock: Clock
      /** The tenant quota in bytes (unset: no limit; reservations are still recorded). */
      tenantBytes: number | undefined
    },
  ) {}

  get tenantBytes(): number | undefined {
    return this.deps.tenantBytes
  }

  /** `give` is asked for room when a reservation is refused; true: it gave some, the reservation is tried again. */
  onShort(give: (tenantId: string) => Promise<boolean>): void {
    this.givers.push(give)
  }

  /** Lowers a reservation to `bytes` (what it still holds for). */
  async shrink(reservation: StorageReservation, bytes: number): Promise<void> {
    reservation.bytes = bytes
    await this.deps.db.q
      .updateTable('storage_reservations')
      .set({ bytes })
      .where('id', '=', reservation.id)
      .execute()
  }

  async held(tenantId: string): Promise<TenantHeld> {
    const poolBytes = await this.poolBytes(tenantId)
    return { poolBytes, ...(await this.heldBeside(tenantId)) }
  }

  /**
   * Reserves `bytes` for the tenant, or refuses with `quota_exceeded` naming what it holds. The
   * pool's figure is read before the lock: the pool's own group limit bounds its trees meanwhile.
   * `upTo`: how much to reserve given the room left (undefined: no quota), `bytes` at least and
   * never more than the room; `replacing`: a reservation of the caller's released in the same
   * transaction (not counted against the new one).
   */
  async reserve(
    tenantId: string,
    bytes: number,
    purpose: string,
    options: ReserveOptions = {},
  ): Promise<StorageReservation> {
    try {
      return await this.reserveOnce(tenantId, bytes, purpose, options)
    } catch (error) {
      if (!(error instanceof CairnProblem && error.code === 'quota_exceeded') || purpose === TURNS_PURPOSE)
        throw error
      let given = false
      for (const give of this.givers) given = (await give(tenantId).catch(() => false)) || given
      if (!given) throw error
      return this.reserveOnce(tenantId, bytes, purpose, options)
    }
  }

  private async reserveOnce(
    tenantId: string,
    bytes: number,
    purpose: string,
    options: ReserveOptions,
  ): Promise<StorageReservation> {
    const quota = this.deps.tenantBytes
    const poolBytes = quota === undefined ? 0 : await this.poolBytes(tenantId)
    const reservation = {
      id: newId('reservation'),
      tenantId,
      bytes: Math.max(bytes, options.upTo?.(undefined) ?? 0),
    }
    await this.deps.db.transaction(async () => {
      await this.lockTenant(tenantId)
      const now = iso(this.deps.clock.now())
      await this.deps.db.q
        .deleteFrom('storage_reservations')
        .where('tenant_id', '=', tenantId)
        .where((eb) =>
          options.replacing
            ? eb.or([eb('expires_at', '<=', now), eb('id', '=', options.replacing.id)])
            : eb('expires_at', '<=', now),
        )
        .execute()
      if (quota !== undefined) {
        const beside = await this.heldBeside(tenantId)
        const heldBytes = heldTotal({ poolBytes, ...beside })
        if (heldBytes + bytes > quota) throw overQuota(purpose, bytes, quota, { poolBytes, ...beside })
        const roomBytes = quota - heldBytes
        reservation.bytes = Math.max(bytes, Math.min(options.upTo?.(roomBytes) ?? bytes, roomBytes))
      }
      await this.deps.db.q
        .insertInto('storage_reservations')
        .values({
          id: reservation.id,
          tenant_id: tenantId,
          bytes: reservation.bytes,
          purpose,
          expires_at: this.leaseEnd(),
        })
        .execute()
    })
    return reservation
  }

  /** Extends the reservation's lease (a copy still running). */
  async renew(reservation: StorageReservation): Promise<void> {
    await this.deps.db.q
      .updateTable('storage_reservations')
      .set({ expires_at: this.leaseEnd() })
      .where('id', '=', reservation.id)
      .execute()
  }

  async release(reservation: StorageReservation): Promise<void> {
    await this.deps.db.q.deleteFrom('storage_reservations').where('id', '=', reservation.id).execute()
  }

  /** Replaces the reservation by what `record` writes, in one transaction. */
  async settle<T>(reservation: StorageReservation, record: () => Promise<T>): Promise<T> {
    return this.deps.db.transaction(async () => {
      await this.release(reservation)
      return record()
    })
  }

  private leaseEnd(): string {
    return iso(this.deps.clock.now() + RESERVATION_LEASE_MS)
  }

  private async poolBytes(tenantId: string): Promise<number> {
    return (await this.deps.runtime.tenantUsage([tenantId]))[tenantId]?.exclusiveBytes ?? 0
  }

  /**
   * What the tenant holds beside the pool: one row the database keeps with every write and delete
   * (`tenant_storage`, storage-triggers.ts), and its reservations under way (a few rows).
   */
  private async heldBeside(tenantId: string): Promise<Omit<TenantHeld, 'poolBytes'>> {
    return {
      ...(await keptBeside(this.deps.db, tenantId)),
      reservedBytes: await reservedBytes(this.deps.db, tenantId, this.deps.clock.now()),
    }
  }

  /**
   * Serialises the tenant's reservations until the transaction ends: an advisory lock on
   * PostgreSQL (every replica); SQLite runs one transaction at a time already.
   */
  private async lockTenant(tenantId: string): Promise<void> {
    if (this.deps.db.dialect !== 'postgres') return
    await sql`SELECT pg_advisory_xact_lock(${TENANT_LOCK_KEY}, hashtext(${tenantId}))`.execute(this.deps.db.q)
  }
}

function overQuota(purpose: string, bytes: number, quotaBytes: number, held: TenantHeld): CairnProblem {
  return new CairnProblem(
    'quota_exceeded',
    `${purpose} (${bytes} bytes) does not fit in the tenant's storage quota of ${quotaBytes} bytes: ${heldTotal(held)} bytes are held (pool ${held.poolBytes}, artifacts ${held.artifactBytes}, command logs ${held.commandLogBytes}, turn events ${held.turnEventBytes}, transcripts ${held.turnTextBytes}, copies under way ${held.reservedBytes})`,
    { quotaBytes, askedBytes: bytes, ...held },
  )
}

function heldTotal(held: TenantHeld): number {
  return (
    held.poolBytes +
    held.artifactBytes +
    held.commandLogBytes +
    held.turnEventBytes +
    held.turnTextBytes +
    held.reservedBytes
  )
}

/** What the tenant keeps beside the pool: its counters' row (`tenant_storage`), read by the check and the usage. */
export async function keptBeside(
  db: Db,
  tenantId: string,
): Promise<Omit<TenantHeld, 'poolBytes' | 'reservedBytes'>> {
  const kept = await db.q
    .selectFrom('tenant_storage')
    .select(['artifact_bytes', 'command_log_bytes', 'turn_event_bytes', 'turn_text_bytes'])
    .where('tenant_id', '=', tenantId)
    .executeTakeFirst()
  return {
    artifactBytes: Number(kept?.artifact_bytes ?? 0),
    commandLogBytes: Number(kept?.command_log_bytes ?? 0),
    turnEventBytes: Number(kept?.turn_event_bytes ?? 0),
    turnTextBytes: Number(kept?.turn_text_bytes ?? 0),
  }
}

/**
 * The tenant's artifacts for `GET /v1/usage`: their bytes as the check counts them (`kept`, the
 * counter), how many (counted), and the space its reservations hold at `nowMs` (lapsed ones left out).
 */
export async function artifactUsage(
  db: Db,
  tenantId: string,
  nowMs: number,
  kept: Pick<TenantHeld, 'artifactBytes'>,
): Promise<{ count: number; bytes: number; reservedBytes: number }> {
  const counted = await db.q
    .selectFrom('artifacts')
    .select((eb) => eb.fn.countAll<number | string>().as('count'))
    .where('tenant_id', '=', tenantId)
    .executeTakeFirst()
  return {
    count: Number(counted?.count ?? 0),
    bytes: kept.artifactBytes,
    reservedBytes: await reservedBytes(db, tenantId, nowMs, true),
  }
}

/** What a process's allowance for a tenant's turns is reserved as (`TurnAdmission`). */
export const TURNS_PURPOSE = 'turns (their prompts and ends)'

/**
 * The space the tenant's reservations hold at `nowMs` (lapsed ones left out); `copies`: only those
 * of copies under way, not the allowances its turns draw on.
 */
async function reservedBytes(db: Db, tenantId: string, nowMs: number, copies = false): Promise<number> {
  const reserved = await db.q
    .selectFrom('storage_reservations')
    .select((eb) => eb.fn.sum<number | string | null>('bytes').as('bytes'))
    .where('tenant_id', '=', tenantId)
    .where('expires_at', '>', iso(nowMs))
    .$if(copies, (q) => q.where('purpose', '!=', TURNS_PURPOSE))
    .executeTakeFirst()
  return Number(reserved?.bytes ?? 0)
}

/**
 * The output logs of the tenant's commands for `GET /v1/usage`: their bytes as the check counts
 * them (`kept`, the counter the triggers keep), and how many its nodes keep (a session's running
 * ones and last `KEPT_ENDED_COMMANDS` ended ones; none of a deleted session, nor of a command lost
 * with its node).
 */
export async function commandLogUsage(
  db: Db,
  tenantId: string,
  kept: Pick<TenantHeld, 'commandLogBytes'>,
): Promise<{ count: number; bytes: number }> {
  const result = await sql<{ count: number | string }>`
    SELECT COUNT(*) AS count
    FROM (
      SELECT c.status,
        ROW_NUMBER() OVER (PARTITION BY c.session_id, c.status ORDER BY c.started_at DESC, c.id DESC) AS n
      FROM commands c JOIN sessions s ON s.id = c.session_id
      WHERE c.tenant_id = ${tenantId} AND c.status != 'lost' AND s.status != 'deleted'
    ) k
    WHERE k.status = 'running' OR k.n <= ${KEPT_ENDED_COMMANDS}`.execute(db.q)
  return { count: Number(result.rows[0]?.count ?? 0), bytes: kept.commandLogBytes }
}
