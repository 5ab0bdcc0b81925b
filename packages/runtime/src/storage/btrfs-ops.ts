import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process'
import { closeSync, existsSync, openSync, readSync } from 'node:fs'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import { CairnProblem } from '@cairn/protocol'
import { execTool } from '../util/exec.js'
import { OWN_PROCESS_GROUP } from '../util/process-group.js'
import { spaceProblem } from './space-problem.js'

const HELPER = fileURLToPath(new URL('../../helpers/btrfs_ops.py', import.meta.url))

type Reply = {
  id: number
  ok: boolean
  error?: string
  errno?: number
  /** The subvolume's ctransid, for `mark` and for a `snapshot` asked to return one. */
  mark?: number
  /** With a snapshot's mark: the filesystem generation it holds at (see `quiet_since`). */
  quiet?: { generation: number; file: string }
} & Record<string, unknown>

function failure(describe: string, reply: Reply): CairnProblem {
  return (
    spaceProblem(reply.errno, describe) ??
    new CairnProblem('storage_error', `${describe} failed: ${reply.error ?? 'unknown error'}`)
  )
}

/**
 * Where a new subvolume's space is counted: its own qgroup joins the level-1 `qgroup` (given as
 * `level/id`, e.g. `1/42`) in the same transaction that creates it, and with `maxReferencedBytes`
 * its own qgroup is capped at that many referenced bytes.
 */
export interface QuotaPlacement {
  qgroup?: string | undefined
  maxReferencedBytes?: number | undefined
}

/** `1/42` as the kernel's 64-bit qgroupid (level in the top 16 bits); exact in a double below 2^53. */
function qgroupNumber(qgroup: string): number {
  const [level, id] = qgroup.split('/').map(Number)
  return (level ?? 0) * 2 ** 48 + (id ?? 0)
}

function placementFields(placement: QuotaPlacement): Record<string, number> {
  return {
    ...(placement.qgroup ? { qgroup: qgroupNumber(placement.qgroup) } : {}),
    ...(placement.maxReferencedBytes ? { max_referenced: placement.maxReferencedBytes } : {}),
  }
}

/** The `btrfs` command fallback for a placement: the limit, once the subvolume exists. */
async function limitWithCommand(path: string, placement: QuotaPlacement): Promise<undefined> {
  if (placement.maxReferencedBytes)
    await btrfsCommand(['qgroup', 'limit', String(placement.maxReferencedBytes), path])
  return undefined
}

interface Pending {
  resolve: (reply: Reply) => void
  reject: (error: Error) => void
  describe: string
}

/**
 * Subvolume operations. A long-lived helper issues the btrfs ioctls directly (about 1 ms for a
 * snapshot instead of 5–6 ms for spawning `btrfs`), which keeps the pre-turn snapshot off the
 * critical path of a warm turn; the `btrfs` command is the fallback when the helper is absent.
 */
export class BtrfsOps {
  // Several helpers, so concurrent snapshots of different sessions reach the kernel together and
  // can share one transaction commit instead of queueing behind each other.
  private readonly helpers: (ChildProcessWithoutNullStreams | undefined)[]
  private readonly pending = new Map<number, Pending>()
  private nextId = 1
  private next = 0
  /** Marks read by a snapshot, by subvolume: each holds while its filesystem's generation stays. */
  private readonly held = new Map<string, { mark: number; generation: number; file: string }>()
  /** The sysfs generation files read, open (one per filesystem: a read is one `pread`). */
  private readonly generationFds = new Map<string, number>()
  private readonly generationText = Buffer.alloc(24)
  private requests = 0

  constructor(helperCount = 4) {
    this.helpers = Array.from({ length: helperCount }, () => undefined)
  }

  /** Requests sent to the long-lived helpers so far (each a round trip to another process). */
  get helperRequests(): number {
    return this.requests
  }

  private ensureHelper(): ChildProcessWithoutNullStreams | undefined {
    const slot = this.next++ % this.helpers.length
    const existing = this.helpers[slot]
    if (existing && existing.exitCode === null) return existing
    if (!existsSync(HELPER) || process.env.CAIRN_BTRFS_HELPER === 'off') return undefined
    const child = spawn('python3', ['-u', HELPER], {
      stdio: ['pipe', 'pipe', 'pipe'],
      ...OWN_PROCESS_GROUP,
    })
    child.stderr.resume()
    child.stdin.on('error', () => undefined)
    createInterface({ input: child.stdout }).on('line', (line) => {
      let reply: Reply
      try {
        reply = JSON.parse(line)
      } catch {
        return
      }
      const waiter = this.pending.get(reply.id)
      if (!waiter) return
      this.pending.delete(reply.id)
      if (reply.ok) waiter.resolve(reply)
      else waiter.reject(failure(waiter.describe, reply))
    })
    child.once('exit', () => {
      for (const waiter of this.pending.values())
        waiter.reject(new CairnProblem('storage_error', `${waiter.describe}: btrfs helper exited`))
      this.pending.clear()
      if (this.helpers[slot] === child) this.helpers[slot] = undefined
    })
    child.unref()
    this.helpers[slot] = child
    return child
  }

  /**
   * Sends `op` to a long-lived helper. Without one, runs `fallback` (by default the helper once,
   * for this request alone); the `btrfs` command fallbacks answer with no reply.
   */
  private request(
    op: Record<string, unknown>,
    describe: string,
    fallback: () => Promise<Reply | undefined> = () => this.once(op, describe),
  ): Promise<Reply | undefined> {
    const helper = this.ensureHelper()
    if (!helper) return fallback()
    this.requests++
    const id = this.nextId++
    return new Promise<Reply>((resolve, reject) => {
      this.pending.set(id, { resolve, reject, describe })
      helper.stdin.write(`${JSON.stringify({ id, ...op })}\n`)
    })
  }

  /**
   * Snapshots `src` at `dst`. With `mark`, resolves to `src`'s change mark read right after the
   * snapshot (see `mark`); undefined without the helper.
   */
  async snapshot(
    src: string,
    dst: string,
    readonly: boolean,
    options: { mark?: boolean } & QuotaPlacement = {},
  ): Promise<number | undefined> {
    const reply = await this.request(
      {
        op: 'snapshot',
        src,
        dst,
        readonly,
        ...(options.mark ? { mark: true } : {}),
        ...placementFields(options),
      },
      `snapshot ${src} -> ${dst}`,
      async () => {
        const inherit = options.qgroup ? ['-i', options.qgroup] : []
        await btrfsCommand(['subvolume', 'snapshot', ...(readonly ? ['-r'] : []), ...inherit, src, dst])
        return limitWithCommand(dst, options)
      },
    )
    if (options.mark) this.hold(src, reply)
    return reply?.mark
  }

  /**
   * The subvolume's ctransid (the transaction of its last inode update), read without a commit;
   * undefined when only the `btrfs` command is available (it does not print it). Answered here,
   * without the helper, while no transaction has begun on the filesystem since the snapshot that
   * read it (see `heldMark`).
   */
  async mark(path: string): Promise<number | undefined> {
    const held = this.heldMark(path)
    if (held !== undefined) return held
    const reply = await this.request(
      { op: 'mark', path },
      `read the change mark of ${path}`,
      async () => undefined,
    )
    return reply?.mark
  }

  /**
   * Turns quotas on for the filesystem at `path`: simple quotas where the kernel has them (an
   * extent counts for the subvolume that wrote it; snapshots and writes stay O(1)), else full
   * qgroups, whose accounting walks every tree sharing a snapshot's data. Resolves to the mode.
   */
  async enableQuotas(path: string): Promise<'squota' | 'qgroup'> {
    const reply = await this.request({ op: 'enable_quotas', path }, `enable quotas on ${path}`, async () => {
      await btrfsCommand(['quota', 'enable', path])
      return undefined
    })
    return reply?.mode === 'squota' ? 'squota' : 'qgroup'
  }

  /**
   * The filesystem's directory in sysfs (`/sys/fs/btrfs/<fsid>`) for the btrfs mounted at `path`:
   * its fsid from the helper's `BTRFS_IOC_FS_INFO`, or from `btrfs filesystem show`.
   */
  async sysfsDir(path: string): Promise<string> {
    const reply = await this.request(
      { op: 'sysfs_dir', path },
      `find the sysfs directory of ${path}`,
      async () => {
        const { stdout } = await execTool('btrfs', ['filesystem', 'show', path], { code: 'storage_error' })
        const fsid = /uuid: ([0-9a-f-]{36})/.exec(stdout)?.[1]
        return fsid ? ({ id: 0, ok: true, dir: `/sys/fs/btrfs/${fsid}` } as Reply) : undefined
      },
    )
    if (typeof reply?.dir !== 'string')
      throw new CairnProblem('storage_error', `no btrfs filesystem id found for ${path}`)
    return reply.dir
  }

  async create(path: string, placement: QuotaPlacement = {}): Promise<void> {
    await this.request(
      { op: 'create', path, ...placementFields(placement) },
      `create subvolume ${path}`,
      async () => {
        await btrfsCommand([
          'subvolume',
          'create',
          ...(placement.qgroup ? ['-i', placement.qgroup] : []),
          path,
        ])
        return limitWithCommand(path, placement)
      },
    )
  }

  async delete(path: string): Promise<void> {
    this.held.delete(path)
    await this.request({ op: 'delete', path }, `delete subvolume ${path}`, () =>
      btrfsCommand(['subvolume', 'delete', path]),
    )
  }

  /**
   * Deletes the subvolume at `path` with every subvolume nested in it (an agent may make its own),
   * innermost first: the nested ones are found and deleted by ID, never by walking path names, so
   * a directory swapped for a link cannot send the deletion into another tree. Needs the helper.
   */
  async deleteTree(path: string): Promise<void> {
    this.held.delete(path)
    await this.request({ op: 'delete_tree', path }, `delete subvolume tree ${path}`)
  }

  /**
   * Makes `dst` a read-only copy of the received subvolume `src` that keeps its received UUID (a
   * later increment finds its parent by it): a read-only subvolume cannot be moved to another
   * directory. Needs the helper.
   */
  async adoptReceived(
    src: string,
    dst: string,
    placement: Pick<QuotaPlacement, 'qgroup'> = {},
  ): Promise<void> {
    await this.request(
      { op: 'adopt_received', src, dst, ...placementFields(placement) },
      `adopt received subvolume ${src} as ${dst}`,
    )
  }

  /** Writes a subvolume's generation marker (an extended attribute on its root directory). */
  async setGeneration(path: string, value: number): Promise<void> {
    await this.request({ op: 'set_generation', path, value }, `set the generation of ${path}`)
  }

  /** The generation markers of several subvolumes (`undefined`: none, or no such subvolume). */
  async getGenerations(paths: string[]): Promise<(number | undefined)[]> {
    if (paths.length === 0) return []
    const reply = await this.request({ op: 'get_generations', paths }, 'read generations')
    const values = Array.isArray(reply?.values) ? reply.values : []
    return paths.map((_, i) => {
      const value = values[i]
      return typeof value === 'number' ? value : undefined
    })
  }

  /** The helper run for one request (when the long-lived ones are turned off). */
  private async once(op: Record<string, unknown>, describe: string): Promise<Reply> {
    const { stdout } = await execTool('python3', [HELPER, JSON.stringify({ id: 0, ...op })], {
      code: 'storage_error',
    })
    const reply = JSON.parse(stdout) as Reply
    if (!reply.ok) throw failure(describe, reply)
    return reply
  }

  /** Keeps the mark a snapshot of `path` read, when the helper said at which generation it holds. */
  private hold(path: string, reply: Reply | undefined): void {
    if (reply?.mark === undefined || !reply.quiet) this.held.delete(path)
    else this.held.set(path, { mark: reply.mark, ...reply.quiet })
  }

  /**
   * The mark a snapshot of `path` read, if no transaction has begun on its filesystem since: the
   * filesystem's generation (sysfs) is the newest transaction begun, and every change to an inode
   * joins one; the helper kept a mark only when the generation was still the snapshot's own,
   * committed, transaction. So the same generation now means the same ctransid, read with one
   * `pread` instead of a round trip to the helper (a turn that wrote nothing anywhere). Any other
   * reading, or none, drops the held mark: the helper is asked.
   */
  private heldMark(path: string): number | undefined {
    const held = this.held.get(path)
    if (!held) return undefined
    if (this.generation(held.file) === held.generation) return held.mark
    this.held.delete(path)
    return undefined
  }

  /** The filesystem generation in `file` (sysfs), or undefined when it cannot be read. */
  private generation(file: string): number | undefined {
    try {
      let fd = this.generationFds.get(file)
      if (fd === undefined) {
        fd = openSync(file, 'r')
        this.generationFds.set(file, fd)
      }
      const text = this.generationText.toString('latin1', 0, readSync(fd, this.generationText, 0, 24, 0))
      return /^\d+\n?$/.test(text) ? Number(text) : undefined
    } catch {
      this.closeGenerationFiles()
      return undefined
    }
  }

  private closeGenerationFiles(): void {
    for (const fd of this.generationFds.values()) closeSync(fd)
    this.generationFds.clear()
  }

  close(): void {
    this.held.clear()
    this.closeGenerationFiles()
    for (const [index, helper] of this.helpers.entries()) {
      helper?.stdin.end()
      this.helpers[index] = undefined
    }
  }
}

/** The `btrfs` command, for when the helper is turned off: it answers with no reply. */
async function btrfsCommand(args: string[]): Promise<undefined> {
  await execTool('btrfs', args, { code: 'storage_error' })
  return undefined
}
