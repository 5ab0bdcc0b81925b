import { createHash } from 'node:crypto'
import path from 'node:path'
import {
  CairnProblem,
  type FileEntry,
  isPersistPath,
  type MergeChange,
  type MergeConflict,
  type MergeStrategy,
  type WorkspaceDiff,
} from '@cairn/protocol'
import type { RuntimePort, TreeRef } from '@cairn/runtime/port'
import { MAX_TEXT_MERGE_BYTES, type MarkerLabels, mergeText, textOf } from './text-merge.js'

/** The three trees of a merge, all read-only snapshots while it runs. */
export interface MergeTrees {
  /** The fork point. */
  base: TreeRef
  /** The fork's changes. */
  theirs: TreeRef
  /** The target as it is. */
  ours: TreeRef
}

/** A file the merge writes: the fork's version (read from its tree) or merged content. */
export interface PlannedWrite extends MergeChange {
  action: 'add' | 'update'
  content: Buffer | undefined
  bytes: number
}

export interface MergePlan {
  writes: PlannedWrite[]
  /** Paths deleted in the target, files before the directories that held them. */
  deletes: string[]
  conflicts: MergeConflict[]
}

type Reader = Pick<RuntimePort, 'diff' | 'listFiles' | 'openFile'>
/** What is at a path: an entry, nothing, or a link or file among its parents (nothing we follow). */
type At = FileEntry['type'] | 'absent' | 'blocked'

const named = (at: At) =>
  at === 'blocked' ? 'a link or a file above it' : at === 'other' ? 'a special file' : `a ${at}`

interface Content {
  hash: string
  /** The bytes, when the file is small enough to merge by line. */
  bytes: Buffer | undefined
}

/** A diff's walk stops at 100,000 entries per tree: a merge of a part of the change is refused. */
function changedPaths(diff: WorkspaceDiff, what: string): string[] {
  if (diff.truncated)
    throw new CairnProblem(
      'payload_too_large',
      `${what} changed more than a diff walks (100,000 entries per tree): merge by hand`,
    )
  // The agent's persisted paths are its own state (a session store, caches), not merged.
  return [...diff.added, ...diff.changed, ...diff.deleted].filter((rel) => !isPersistPath(rel))
}

/**
 * Decides, path by path, what merging the fork's changes (base → theirs) into the target (base →
 * ours) does; reads only, writes nothing. See docs/merge.md for the rules.
 */
export class MergePlanner {
  private readonly listings = new Map<string, Promise<Map<string, FileEntry> | 'blocked'>>()
  private readonly plan: MergePlan = { writes: [], deletes: [], conflicts: [] }
  private oursChanged = new Set<string>()

  constructor(
    private readonly runtime: Reader,
    private readonly trees: MergeTrees,
    private readonly strategy: MergeStrategy,
    private readonly labels: MarkerLabels,
    private readonly signal?: AbortSignal,
  ) {}

  async run(): Promise<MergePlan> {
    const options = { background: true, ...(this.signal ? { signal: this.signal } : {}) }
    const [theirs, ours] = await Promise.all([
      this.runtime.diff(this.trees.base, this.trees.theirs, 'base', options),
      this.runtime.diff(this.trees.base, this.trees.ours, 'base', options),
    ])
    this.oursChanged = new Set(changedPaths(ours, 'the target'))
    for (const encoded of Object.values(theirs.bytePaths ?? {}).flat())
      this.conflict(Buffer.from(encoded, 'base64').toString('utf8'), 'unsupported', {
        reason: `a name that is not UTF-8 (its bytes, base64: ${encoded}); the merge writes UTF-8 names only`,
      })
    for (const rel of changedPaths(theirs, 'the fork').sort()) await this.decide(rel)
    // Files first, then directories deepest first (a directory goes once it is empty).
    this.plan.deletes.sort((a, b) => b.split('/').length - a.split('/').length || a.localeCompare(b))
    return this.plan
  }

  private async decide(rel: string): Promise<void> {
    const [base, theirs, ours] = await Promise.all([
      this.at(this.trees.base, rel),
      this.at(this.trees.theirs, rel),
      this.at(this.trees.ours, rel),
    ])
    const touched = this.oursChanged.has(rel)
    if (theirs === 'directory') {
      if (ours !== 'absent' && ours !== 'directory')
        this.conflict(rel, 'type', { reason: `a directory in the fork, ${named(ours)} in the target` })
      return
    }
    if (theirs === 'absent') return this.deleted(rel, base, ours, touched)
    if (theirs !== 'file') return this.notAFile(rel, theirs)
    if (base !== 'absent' && base !== 'file')
      return this.conflict(rel, 'type', { reason: `a file in the fork, ${named(base)} at the fork point` })
    if (ours !== 'absent' && ours !== 'file')
      return this.conflict(rel, 'type', { reason: `a file in the fork, ${named(ours)} in the target` })
    if (!touched) return this.take(rel, base === 'absent' ? 'add' : 'update')
    if (ours === 'absent') return this.modifiedDeleted(rel, base)
    await this.bothChanged(rel, base === 'file')
  }

  /** The fork changed a link or a special file: listed, unless the target has the very same. */
  private async notAFile(rel: string, theirs: At): Promise<void> {
    const [fork, target] = await Promise.all([
      this.entry(this.trees.theirs, rel),
      this.entry(this.trees.ours, rel),
    ])
    if (fork && target && fork.type === target.type && fork.target === target.target) return
    this.conflict(rel, 'unsupported', {
      reason: `${named(theirs)} in the fork: the merge writes regular files only`,
    })
  }

  /** The fork deleted `rel`. */
  private async deleted(rel: string, base: At, ours: At, touched: boolean): Promise<void> {
    if (ours === 'absent') return
    if (base === 'directory') {
      if (ours !== 'directory')
        return this.conflict(rel, 'type', {
          reason: `a directory deleted in the fork, ${named(ours)} in the target`,
        })
      // Only a directory the target added nothing to and changed nothing in goes whole.
      const prefix = `${rel}/`
      if (!touched && ![...this.oursChanged].some((p) => p.startsWith(prefix))) this.plan.deletes.push(rel)
      return
    }
    if (!touched) {
      this.plan.deletes.push(rel)
      return
    }
    if (base === 'file' && ours === 'file') {
      const [was, now] = await Promise.all([this.read(this.trees.base, rel), this.read(this.trees.ours, rel)])
      if (was.hash === now.hash) this.plan.deletes.push(rel)
      else
        this.conflict(rel, 'delete_modify', {
          deletedIn: 'fork',
          reason: 'deleted in the fork, changed in the target',
        })
      return
    }
    this.conflict(rel, 'type', { reason: `${named(base)} deleted in the fork, ${named(ours)} in the target` })
  }

  /** The fork changed `rel`, the target deleted it. */
  private async modifiedDeleted(rel: string, base: At): Promise<void> {
    if (base === 'file') {
      const [was, now] = await Promise.all([
        this.read(this.trees.base, rel),
        this.read(this.trees.theirs, rel),
      ])
      if (was.hash === now.hash) return
    }
    this.conflict(rel, 'delete_modify', {
      deletedIn: 'target',
      reason: 'changed in the fork, deleted in the target',
    })
  }

  /** Both sides have a file at `rel` and both changed (or added) it. */
  private async bothChanged(rel: string, inBase: boolean): Promise<void> {
    const [was, mine, other] = await Promise.all([
      inBase ? this.read(this.trees.base, rel) : Promise.resolve(undefined),
      this.read(this.trees.ours, rel),
      this.read(this.trees.theirs, rel),
    ])
    if (mine.hash === other.hash || other.hash === was?.hash) return
    if (mine.hash === was?.hash) return this.take(rel, 'update')
    const texts = [was?.bytes ?? Buffer.alloc(0), mine.bytes, other.bytes].map((b) =>
      b ? textOf(b) : undefined,
    )
    const [base, ours, theirs] = texts
    if (base === undefined || ours === undefined || theirs === undefined)
      return this.conflict(rel, 'content', {
        binary: true,
        reason: `changed on both sides and not text (a NUL byte, not UTF-8, or over ${MAX_TEXT_MERGE_BYTES} bytes)`,
      })
    const merged = mergeText(ours, base, theirs, this.labels)
    if (merged.clean) return this.write(rel, 'update', 'merged', Buffer.from(merged.text))
    if (merged.text === undefined) return this.conflict(rel, 'content', { reason: merged.reason })
    const reason = `${merged.conflicts} overlapping change(s) to the same lines`
    if (this.strategy === 'markers') {
      this.write(rel, 'update', 'markers', Buffer.from(merged.text))
      this.conflict(rel, 'content', { reason, resolution: 'markers' })
    } else this.conflict(rel, 'content', { reason })
  }

  /** The fork's version, copied as it is. */
  private async take(rel: string, action: 'add' | 'update'): Promise<void> {
    const entry = await this.entry(this.trees.theirs, rel)
    this.plan.writes.push({ path: rel, action, how: 'taken', content: undefined, bytes: entry?.size ?? 0 })
  }

  private write(rel: string, action: 'add' | 'update', how: 'merged' | 'markers', content: Buffer): void {
    this.plan.writes.push({ path: rel, action, how, content, bytes: content.length })
  }

  private conflict(
    rel: string,
    kind: MergeConflict['kind'],
    more: Partial<Pick<MergeConflict, 'binary' | 'deletedIn' | 'resolution'>> & { reason: string },
  ): void {
    this.plan.conflicts.push({ path: rel, kind, binary: false, resolution: 'keep', ...more })
  }

  /** A file's content hash, and its bytes when it is small enough to merge by line. */
  private async read(tree: TreeRef, rel: string): Promise<Content> {
    const { size, stream } = await this.runtime.openFile(tree, Buffer.from(rel), { background: true })
    const hash = createHash('sha256')
    const kept: Buffer[] = []
    const keep = size <= MAX_TEXT_MERGE_BYTES
    for await (const chunk of stream as AsyncIterable<Buffer>) {
      hash.update(chunk)
      if (keep) kept.push(chunk)
    }
    return { hash: hash.digest('hex'), bytes: keep ? Buffer.concat(kept) : undefined }
  }

  private async at(tree: TreeRef, rel: string): Promise<At> {
    const listed = await this.listing(tree, path.posix.dirname(rel))
    if (listed === 'blocked') return 'blocked'
    return listed.get(path.posix.basename(rel))?.type ?? 'absent'
  }

  private async entry(tree: TreeRef, rel: string): Promise<FileEntry | undefined> {
    const listed = await this.listing(tree, path.posix.dirname(rel))
    return listed === 'blocked' ? undefined : listed.get(path.posix.basename(rel))
  }

  /** One directory of a tree, listed once per merge; a link or a file in its path: `blocked`. */
  private listing(tree: TreeRef, dir: string): Promise<Map<string, FileEntry> | 'blocked'> {
    const key = `${JSON.stringify(tree)}\0${dir}`
    let listed = this.listings.get(key)
    if (!listed) {
      listed = this.runtime.listFiles(tree, Buffer.from(dir === '.' ? '' : dir), { background: true }).then(
        (entries) => new Map(entries.map((entry) => [entry.name, entry])),
        (error: unknown) => {
          if (!(error instanceof CairnProblem)) throw error
          if (error.code === 'not_found') return new Map<string, FileEntry>()
          if (error.code === 'forbidden' || error.code === 'validation_failed') return 'blocked' as const
          throw error
        },
      )
      this.listings.set(key, listed)
    }
    return listed
  }
}
