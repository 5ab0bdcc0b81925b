import { createHash } from 'node:crypto'
import { createWriteStream, existsSync } from 'node:fs'
import { mkdir, readFile, rm, statfs } from 'node:fs/promises'
import path from 'node:path'
import { Transform } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { type Artifact, CairnProblem, newId } from '@cairn/protocol'
import type { RuntimePort } from '@cairn/runtime/port'
import type { Logger } from 'pino'
import { type Clock, iso } from '../clock.js'
import type { Db } from '../db/database.js'
import {
  RESERVATION_LEASE_MS,
  type StorageBudget,
  type StorageReservation,
} from '../limits/storage-budget.js'

export type ArtifactInfo = Artifact

/**
 * Promoted artifacts: files copied out of a workspace, kept after their session is deleted. Their
 * bytes live on the data dir's disk, beside the database (and in the database with PostgreSQL, so
 * every replica can serve them), and count in the tenant's storage budget with its pool trees.
 * A file counts at its apparent size (a sparse file's holes too): the copy is written densely.
 */
export class ArtifactStore {
  /** Bytes of copies under way in this process: they are not on the data disk yet. */
  private copyingBytes = 0

  constructor(
    private readonly deps: {
      db: Db
      /** Reads the file to keep from the workspace (its reader never follows a link). */
      runtime: Pick<RuntimePort, 'openFile'>
      clock: Clock
      logger: Logger
      budget: StorageBudget
      /** Host directory for artifact bytes (under the data dir). */
      root: string
      /** A copy never brings the data disk's free space below this, so no tenant starves Cairn's own data. */
      diskReserveBytes: number
    },
  ) {}

  /**
   * Copies `/workspace/<rel>` into the store. Its size is reserved in the tenant's budget before
   * the first byte is copied (refused `quota_exceeded` when it does not fit), and the copy stops
   * at that size: a file that grew meanwhile is refused (`conflict`) and leaves nothing.
   */
  async save(
    row: { tenantId: string; agentId: string; sessionId: string },
    rel: string,
  ): Promise<ArtifactInfo> {
    const file = await this.deps.runtime.openFile({ sessionId: row.sessionId }, Buffer.from(rel))
    const id = newId('artifact')
    const dir = path.join(this.deps.root, row.agentId)
    let reservation: StorageReservation
    try {
      await mkdir(dir, { recursive: true, mode: 0o700 })
      await this.checkDisk(dir, rel, file.size)
      reservation = await this.deps.budget.reserve(row.tenantId, file.size, `/workspace/${rel}`)
    } catch (error) {
      file.stream.destroy()
      throw error
    }
    this.copyingBytes += file.size
    const renewal = setInterval(() => {
      this.deps.budget
        .renew(reservation)
        .catch((error: unknown) =>
          this.deps.logger.warn({ err: error }, 'renewing a storage reservation failed'),
        )
    }, RESERVATION_LEASE_MS / 3)
    renewal.unref()
    const target = path.join(dir, id)
    try {
      const copied = await copyAtMost(file.stream, target, file.size, rel)
      const info: ArtifactInfo = {
        id,
        agentId: row.agentId,
        sessionId: row.sessionId,
        path: `/workspace/${rel}`,
        sizeBytes: copied.sizeBytes,
        sha256: copied.sha256,
        createdAt: iso(this.deps.clock.now()),
      }
      await this.record(row.tenantId, info, target, reservation)
      return info
    } catch (error) {
      await rm(target, { force: true })
      await this.deps.budget.release(reservation)
      throw error
    } finally {
      clearInterval(renewal)
      this.copyingBytes -= file.size
    }
  }

  /** Settles the reservation into the artifact's row (and, on PostgreSQL, its bytes). */
  private async record(
    tenantId: string,
    info: ArtifactInfo,
    target: string,
    reservation: StorageReservation,
  ): Promise<void> {
    // A replica other than this one serves the download: with a shared database the bytes are
    // stored in it too (on SQLite the file in the data dir is the only copy).
    const shared = this.deps.db.dialect === 'postgres' ? await readFile(target) : undefined
    await this.deps.budget.settle(reservation, async () => {
      await this.deps.db.q
        .insertInto('artifacts')
        .values({
          id: info.id,
          tenant_id: tenantId,
          agent_id: info.agentId,
          session_id: info.sessionId,
          path: info.path,
          size_bytes: info.sizeBytes,
          sha256: info.sha256,
          created_at: info.createdAt,
        })
        .execute()
      if (shared)
        await this.deps.db.q
          .insertInto('artifact_blobs')
          .values({ artifact_id: info.id, content: shared })
          .execute()
    })
  }

  /** Refuses a copy that would bring the data disk below its reserve, copies under way included. */
  private async checkDisk(dir: string, rel: string, bytes: number): Promise<void> {
    const disk = await statfs(dir)
    const roomBytes = Math.max(0, disk.bavail * disk.bsize - this.deps.diskReserveBytes - this.copyingBytes)
    if (bytes > roomBytes)
      throw new CairnProblem(
        'quota_exceeded',
        `/workspace/${rel} (${bytes} bytes) does not fit in the artifact store: ${roomBytes} bytes are left above the data disk's reserve`,
        { allowedBytes: roomBytes },
      )
  }

  async list(agentId: string): Promise<ArtifactInfo[]> {
    const rows = await this.deps.db.q
      .selectFrom('artifacts')
      .selectAll()
      .where('agent_id', '=', agentId)
      .orderBy('created_at')
      .orderBy('id')
      .execute()
    return rows.map((r) => ({
      id: r.id,
      agentId: r.agent_id,
      sessionId: r.session_id,
      path: r.path,
      sizeBytes: r.size_bytes,
      sha256: r.sha256,
      createdAt: r.created_at,
    }))
  }

  async file(agentId: string, id: string): Promise<{ file: string; info: ArtifactInfo }> {
    const info = (await this.list(agentId)).find((a) => a.id === id)
    if (!info) throw new CairnProblem('not_found', `No artifact ${id}`)
    return { file: path.join(this.deps.root, agentId, id), info }
  }

  async read(agentId: string, id: string): Promise<Buffer> {
    const { file } = await this.file(agentId, id)
    if (existsSync(file) || this.deps.db.dialect !== 'postgres') return readFile(file)
    // Saved through another replica: its bytes are in the database.
    const row = await this.deps.db.q
      .selectFrom('artifact_blobs')
      .select('content')
      .where('artifact_id', '=', id)
      .executeTakeFirst()
    if (!row) throw new CairnProblem('not_found', `the bytes of artifact ${id} are gone`)
    return row.content
  }

  /**
   * Deletes an artifact: its row and bytes go in one transaction, so its size leaves the tenant's
   * budget at once; the file in this data dir follows (another replica's copy, if it saved it
   * there, is left to that replica's disk).
   */
  async delete(agentId: string, id: string): Promise<ArtifactInfo> {
    const { file, info } = await this.file(agentId, id)
    const deleted = await this.deps.db.transaction(async () => {
      const gone = await this.deps.db.q
        .deleteFrom('artifacts')
        .where('id', '=', id)
        .where('agent_id', '=', agentId)
        .executeTakeFirst()
      await this.deps.db.q.deleteFrom('artifact_blobs').where('artifact_id', '=', id).execute()
      return Number(gone.numDeletedRows) > 0
    })
    if (!deleted) throw new CairnProblem('not_found', `No artifact ${id}`)
    await rm(file, { force: true })
    return info
  }
}

/** Copies `stream` to a new file at `target`, refusing (`conflict`) any byte past `limitBytes`. */
async function copyAtMost(
  stream: NodeJS.ReadableStream,
  target: string,
  limitBytes: number,
  rel: string,
): Promise<{ sizeBytes: number; sha256: string }> {
  const hash = createHash('sha256')
  let sizeBytes = 0
  const counted = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      sizeBytes += chunk.length
      if (sizeBytes > limitBytes)
        return done(
          new CairnProblem(
            'conflict',
            `/workspace/${rel} grew past its ${limitBytes} bytes while it was copied; save it again once it stops changing`,
            { reservedBytes: limitBytes },
          ),
        )
      hash.update(chunk)
      done(null, chunk)
    },
  })
  await pipeline(stream, counted, createWriteStream(target, { mode: 0o600, flags: 'wx' }))
  return { sizeBytes, sha256: hash.digest('hex') }
}
