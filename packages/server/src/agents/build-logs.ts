import { createWriteStream, existsSync, mkdirSync, type WriteStream } from 'node:fs'
import { readFile, rm } from 'node:fs/promises'
import path from 'node:path'
import type { Db } from '../db/database.js'

/** `index`: the event's place in the log's stream from 1 (its SSE `id:`); the end's is the line count + 1. */
export type BuildLogEvent =
  | { type: 'log'; index: number; line: string }
  | { type: 'end'; index: number; status: 'READY' | 'FAILED'; error?: string }

interface LiveLog {
  file: WriteStream
  lines: string[]
  listeners: Set<(event: BuildLogEvent) => void>
}

/**
 * Build logs: live in memory (with subscribers) while the build runs, written to a file as it
 * goes, and stored in the database when it ends, where every replica reads it (logs of builds
 * older than the database copy are read from their file).
 */
export class BuildLogs {
  private readonly live = new Map<string, LiveLog>()

  constructor(
    private readonly dir: string,
    private readonly db: Db,
  ) {}

  private file(revisionId: string): string {
    return path.join(this.dir, `${revisionId}.log`)
  }

  /**
   * Makes the revision's log live. Synchronous, so that the log is live before the deploy that
   * starts the build answers: a follower that comes at once never finds a building revision
   * without a live log (it was answered `end` with status DEPLOYING).
   */
  open(revisionId: string): void {
    mkdirSync(this.dir, { recursive: true, mode: 0o700 })
    this.live.set(revisionId, {
      file: createWriteStream(this.file(revisionId), { flags: 'a', mode: 0o600 }),
      lines: [],
      listeners: new Set(),
    })
  }

  append(revisionId: string, line: string): void {
    const live = this.live.get(revisionId)
    if (!live) return
    live.lines.push(line)
    live.file.write(`${line}\n`)
    const index = live.lines.length
    for (const listener of live.listeners) listener({ type: 'log', index, line })
  }

  async close(revisionId: string, status: 'READY' | 'FAILED', error?: string): Promise<void> {
    const live = this.live.get(revisionId)
    if (!live) return
    await new Promise<void>((resolve) => live.file.end(resolve))
    const log = live.lines.map((line) => `${line}\n`).join('')
    await this.db.q
      .insertInto('build_logs')
      .values({ revision_id: revisionId, log })
      .onConflict((oc) => oc.column('revision_id').doUpdateSet({ log }))
      .execute()
    this.live.delete(revisionId)
    const index = live.lines.length + 1
    for (const listener of live.listeners)
      listener({ type: 'end', index, status, ...(error ? { error } : {}) })
  }

  /** Removes the log's file from this data dir (retention emptied its stored copy; a live log stays). */
  async forget(revisionId: string): Promise<void> {
    if (!this.live.has(revisionId)) await rm(this.file(revisionId), { force: true })
  }

  isLive(revisionId: string): boolean {
    return this.live.has(revisionId)
  }

  /** Lines so far, and a subscription to what follows while the build runs. */
  async read(revisionId: string): Promise<string[]> {
    const live = this.live.get(revisionId)
    if (live) return [...live.lines]
    const stored = await this.db.q
      .selectFrom('build_logs')
      .select('log')
      .where('revision_id', '=', revisionId)
      .executeTakeFirst()
    if (stored) return stored.log ? stored.log.replace(/\n$/, '').split('\n') : []
    if (!existsSync(this.file(revisionId))) return []
    const text = await readFile(this.file(revisionId), 'utf8')
    return text ? text.replace(/\n$/, '').split('\n') : []
  }

  subscribe(revisionId: string, listener: (event: BuildLogEvent) => void): () => void {
    const live = this.live.get(revisionId)
    if (!live) return () => undefined
    live.listeners.add(listener)
    return () => live.listeners.delete(listener)
  }

  tail(lines: string[], count = 20): string {
    return lines.slice(-count).join('\n')
  }
}
