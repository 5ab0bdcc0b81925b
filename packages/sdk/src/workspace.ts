import type {
  FileEntry,
  ForksResult,
  MergeResult,
  MergeStrategy,
  SessionInfo,
  SessionPolicyInput,
  SnapshotInfo,
  WorkspaceDiff,
} from '@cairn/protocol'
import { InvalidResponseError } from './errors.js'
import { asList, asSession, checked } from './guards.js'
import type { HttpClient, RequestOptions } from './http.js'
import * as valid from './validators.js'

const path = (id: string, rest: string) => `/v1/sessions/${encodeURIComponent(id)}${rest}`
const isRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v)

function expectRecord<T>(value: unknown, keys: string[], what: string): T {
  if (!isRecord(value) || keys.some((k) => !(k in value))) {
    throw new InvalidResponseError({
      code: 'invalid_response',
      message: `the server sent an unexpected ${what}`,
    })
  }
  return value as T
}

const asSnapshot = (v: unknown): SnapshotInfo => checked(valid.Snapshot, v, 'snapshot')
const asFileEntry = (v: unknown): FileEntry => checked(valid.FileEntry, v, 'file entry')

/** What to fill in on snapshot records: both read the snapshot's tree, so they are opt-in. */
export interface SnapshotExtras {
  /** The content digest (computed on first request, then stored). */
  digest?: boolean | undefined
  /** Referenced and exclusive bytes (measured on every request). */
  sizes?: boolean | undefined
}

const extrasQuery = (digest: boolean | undefined, sizes: boolean | undefined) => ({
  digest: digest ? 'true' : undefined,
  sizes: sizes ? 'true' : undefined,
})

/**
 * How long a merge call waits unless told otherwise: each file is written by the server's
 * sandboxed writer (a fraction of a second each), so a merge of many files outlasts the client's
 * usual timeout.
 */
const MERGE_TIMEOUT_MS = 15 * 60_000

/** Which snapshot: its ID, or the turn it follows (0: before the first turn). */
export type SnapshotRef = { snapshotId: string } | { turn: number }

export interface RestoreResult {
  session: SessionInfo
  snapshot: SnapshotInfo
}

/** A session's snapshots: O(1) read-only copies of its workspace, taken with the sandbox frozen. */
export class Snapshots {
  constructor(
    private readonly http: HttpClient,
    private readonly sessionId: string,
  ) {}

  /**
   * Takes a snapshot. `memory: true` also keeps the memory of the session's running sandbox (a
   * `pause: memory` session under a driver that checkpoints memory): forks from the snapshot start
   * from that running state.
   */
  async create(
    options: RequestOptions & { label?: string | undefined; memory?: boolean | undefined } = {},
  ): Promise<SnapshotInfo> {
    const { label, memory, ...request } = options
    return asSnapshot(
      await this.http.json({
        method: 'POST',
        path: path(this.sessionId, '/snapshots'),
        json: memory === undefined ? { label } : { label, memory },
        ...request,
      }),
    )
  }

  /**
   * The snapshots, oldest first. `digest: true` fills in every content digest (reads every file
   * once); `sizes: true` measures each one's referenced and exclusive bytes (on every call:
   * exclusive bytes grow as the workspace and other snapshots stop sharing data).
   */
  async list(options: RequestOptions & SnapshotExtras = {}): Promise<SnapshotInfo[]> {
    const { digest, sizes, ...request } = options
    const body = await this.http.json({
      method: 'GET',
      path: path(this.sessionId, '/snapshots'),
      query: extrasQuery(digest, sizes),
      ...request,
    })
    return asList(body, asSnapshot, 'snapshot list')
  }

  /**
   * One snapshot. `digest: true` returns its content digest (SHA-256 over paths, types, modes,
   * link targets and contents): computed on first request, then stored, as a snapshot never changes.
   * `sizes: true` measures its referenced and exclusive bytes now.
   */
  async get(snapshotId: string, options: RequestOptions & SnapshotExtras = {}): Promise<SnapshotInfo> {
    const { digest, sizes, ...request } = options
    const body = await this.http.json({
      method: 'GET',
      path: path(this.sessionId, `/snapshots/${encodeURIComponent(snapshotId)}`),
      query: extrasQuery(digest, sizes),
      ...request,
    })
    return asSnapshot(body)
  }

  /** The content digest of a snapshot (`sha256:…`). */
  async digest(snapshotId: string, options: RequestOptions = {}): Promise<string> {
    const snap = await this.get(snapshotId, { ...options, digest: true })
    if (typeof snap.digest !== 'string')
      throw new InvalidResponseError({ code: 'invalid_response', message: 'the server sent no digest' })
    return snap.digest
  }

  /**
   * Deletes a snapshot, freeing what it alone holds (the space comes back within seconds).
   * A `ConflictError` with code `snapshot_in_use` while a restore, fork or export
   * reads it.
   */
  async delete(snapshotId: string, options: RequestOptions = {}): Promise<void> {
    await this.http.json({
      method: 'DELETE',
      path: path(this.sessionId, `/snapshots/${encodeURIComponent(snapshotId)}`),
      ...options,
    })
  }

  /** Replaces the workspace with a snapshot: an exact replica, no leftovers. */
  async restore(
    ref: SnapshotRef,
    options: RequestOptions & { policy?: SessionPolicyInput | undefined } = {},
  ): Promise<RestoreResult> {
    const { policy, ...request } = options
    const body = await this.http.json({
      method: 'POST',
      path: path(this.sessionId, '/restore'),
      json: { ...ref, policy },
      ...request,
    })
    return this.restoreResult(body)
  }

  /** Restores the workspace as it was before the last turn. */
  async undo(options: RequestOptions = {}): Promise<RestoreResult> {
    return this.restoreResult(
      await this.http.json({ method: 'POST', path: path(this.sessionId, '/undo'), ...options }),
    )
  }

  /** A new session from a snapshot (default: the latest), with the transcript up to its turn. */
  async fork(
    options: RequestOptions & {
      snapshotId?: string | undefined
      turn?: number | undefined
      title?: string | undefined
      /** Overrides of the parent's lifecycle policy (the fork inherits the rest). */
      policy?: SessionPolicyInput | undefined
    } = {},
  ): Promise<SessionInfo> {
    const { snapshotId, turn, title, policy, ...request } = options
    const body = await this.http.json({
      method: 'POST',
      path: path(this.sessionId, '/fork'),
      json: { snapshotId, turn, title, policy },
      ...request,
    })
    return asSession(body)
  }

  /**
   * `count` forks (default 1) of the session as it is now, all from one snapshot taken for them.
   * With `memory: true` (a `pause: memory` session, warm or paused, under a driver that checkpoints
   * memory) each fork's first message restores the session's running state as of that instant:
   * its processes and their memory, beside the files of the same instant. The session goes on
   * from there at its next message. A `ValidationError` with code `capability_unavailable` (its
   * `details.reason` says why) where the agent's driver cannot.
   */
  async forks(
    options: RequestOptions & {
      memory?: boolean | undefined
      count?: number | undefined
      title?: string | undefined
      /** The label of the snapshot the forks start from. */
      label?: string | undefined
      /** Overrides of the parent's lifecycle policy (the forks inherit the rest). */
      policy?: SessionPolicyInput | undefined
    } = {},
  ): Promise<ForksResult> {
    const { memory, count, title, label, policy, ...request } = options
    const body = await this.http.json({
      method: 'POST',
      path: path(this.sessionId, '/forks'),
      json: { memory, count, title, label, policy },
      ...request,
    })
    return checked(valid.ForksResult, body, 'forks result')
  }

  /**
   * Merges this fork's changes since its fork point into its parent (or `into`, another session of
   * the same agent): a three-way merge, text files line by line. Conflicts are listed per file and
   * left to you (`strategy: 'markers'` writes overlapping text changes with conflict markers); the
   * target is snapshotted first (`result.snapshot`: restore it to undo). `preview: true` changes
   * nothing. A `ConflictError` with code `merge_base_missing` when the fork point is gone. Waits
   * up to 15 minutes unless `timeoutMs` says otherwise (the server writes file by file).
   */
  async merge(
    options: RequestOptions & {
      into?: string | undefined
      /** Merge this snapshot of the fork instead of its live workspace. */
      snapshotId?: string | undefined
      preview?: boolean | undefined
      strategy?: MergeStrategy | undefined
    } = {},
  ): Promise<MergeResult> {
    const { into, snapshotId, preview, strategy, ...request } = options
    const body = await this.http.json({
      method: 'POST',
      path: path(this.sessionId, '/merge'),
      json: { into, snapshotId, preview, strategy },
      ...request,
      timeoutMs: request.timeoutMs ?? MERGE_TIMEOUT_MS,
    })
    return checked(valid.MergeResult, body, 'merge result')
  }

  private restoreResult(body: unknown): RestoreResult {
    const result = expectRecord<{ session: unknown; snapshot: unknown }>(
      body,
      ['session', 'snapshot'],
      'restore result',
    )
    return { session: asSession(result.session), snapshot: asSnapshot(result.snapshot) }
  }
}

export interface ImportResult {
  session: SessionInfo
  /** The workspace as it was before the import. */
  snapshot: SnapshotInfo
  /** Entries in the archive and the bytes they unpack to. */
  fileCount: number
  sizeBytes: number
}

export interface FileOptions extends RequestOptions {
  /** Read from this snapshot instead of the live workspace. */
  snapshot?: string | undefined
}

/** The files of a session's `/workspace` (paths relative to it), confined to it by the server. */
export class Files {
  constructor(
    private readonly http: HttpClient,
    private readonly sessionId: string,
  ) {}

  async list(dir = '', options: FileOptions = {}): Promise<FileEntry[]> {
    const { snapshot, ...request } = options
    const body = await this.http.json({
      method: 'GET',
      path: path(this.sessionId, '/files'),
      query: { path: dir, snapshot },
      ...request,
    })
    return asList(body, asFileEntry, 'file list')
  }

  /** A file's bytes as a stream. */
  async stream(file: string, options: FileOptions = {}): Promise<ReadableStream<Uint8Array>> {
    const { snapshot, ...request } = options
    return this.download(path(this.sessionId, '/files/content'), { path: file, snapshot }, request)
  }

  async read(file: string, options: FileOptions = {}): Promise<Uint8Array> {
    return new Uint8Array(await new Response(await this.stream(file, options)).arrayBuffer())
  }

  async readText(file: string, options: FileOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.read(file, options))
  }

  /** Writes a file (parents are created); the agent sees it on its next turn. */
  async write(file: string, content: string | Uint8Array, options: RequestOptions = {}): Promise<void> {
    await this.http.json({
      method: 'PUT',
      path: path(this.sessionId, '/files/content'),
      query: { path: file },
      body: typeof content === 'string' ? new TextEncoder().encode(content) : content,
      contentType: 'application/octet-stream',
      ...options,
    })
  }

  async delete(file: string, options: RequestOptions = {}): Promise<void> {
    await this.http.json({
      method: 'DELETE',
      path: path(this.sessionId, '/files'),
      query: { path: file },
      ...options,
    })
  }

  /** Files added, changed and deleted since the revision (or the snapshot `from`). */
  async diff(options: RequestOptions & { from?: string | undefined } = {}): Promise<WorkspaceDiff> {
    const { from, ...request } = options
    const body = await this.http.json({
      method: 'GET',
      path: path(this.sessionId, '/diff'),
      query: { from },
      ...request,
    })
    return checked(valid.Diff, body, 'diff')
  }

  /** The workspace (or a snapshot of it) as a tar.gz stream. */
  async export(options: FileOptions = {}): Promise<ReadableStream<Uint8Array>> {
    const { snapshot, ...request } = options
    return this.download(path(this.sessionId, '/export'), { snapshot }, request)
  }

  /**
   * Replaces the workspace with a tar.gz (`merge: true` unpacks it over the workspace instead).
   * The server checks it like a deploy (no absolute paths, `..` or links out; size limits) and
   * snapshots the workspace first: restore `snapshot` to undo the import.
   */
  async import(
    archive: Uint8Array,
    options: RequestOptions & { merge?: boolean | undefined } = {},
  ): Promise<ImportResult> {
    const { merge, ...request } = options
    const body = await this.http.json({
      method: 'PUT',
      path: path(this.sessionId, '/workspace'),
      query: { mode: merge ? 'merge' : 'replace' },
      body: archive,
      contentType: 'application/gzip',
      ...request,
    })
    const result = expectRecord<{
      session: unknown
      snapshot: unknown
      fileCount: number
      sizeBytes: number
    }>(body, ['session', 'snapshot', 'fileCount', 'sizeBytes'], 'import result')
    return {
      session: asSession(result.session),
      snapshot: asSnapshot(result.snapshot),
      fileCount: result.fileCount,
      sizeBytes: result.sizeBytes,
    }
  }

  private async download(
    route: string,
    query: Record<string, string | undefined>,
    request: RequestOptions,
  ): Promise<ReadableStream<Uint8Array>> {
    const { response, done } = await this.http.stream({
      method: 'GET',
      path: route,
      query,
      accept: '*/*',
      ...request,
    })
    if (!response.body) {
      done()
      throw new InvalidResponseError({ code: 'invalid_response', message: 'the download has no body' })
    }
    const reader = response.body.getReader()
    return new ReadableStream<Uint8Array>({
      async pull(controller) {
        try {
          const chunk = await reader.read()
          if (chunk.done) {
            done()
            controller.close()
          } else {
            controller.enqueue(chunk.value)
          }
        } catch (error) {
          done()
          controller.error(error)
        }
      },
      cancel(reason) {
        done()
        return reader.cancel(reason)
      },
    })
  }
}
