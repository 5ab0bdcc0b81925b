import { CairnProblem } from '@cairn/protocol'
import type { ImagesUsage } from '../storage/pool.js'

/**
 * Room left in the shared images' group below which a failed build or pull is taken for one the
 * group's limit stopped: the kernel refuses the write that would pass it, so the group ends up to
 * one write short of its limit (a package file, a layer's chunk), not exactly at it (an eighth of
 * a limit smaller than 128 MiB).
 */
const FULL_SLACK_BYTES = 16 * 1024 * 1024

function mebibytes(bytes: number): string {
  return (bytes / 1024 / 1024).toFixed(1)
}

/** Where the images' figures come from (the image store, over the pool). */
export interface ImagesRoomSource {
  usage(): Promise<ImagesUsage | undefined>
}

/** The typed refusal of an image the shared images' group has no room for, naming its figures. */
export function imagesFull(what: string, usage: ImagesUsage, admittedBytes = 0): CairnProblem {
  const admitted =
    admittedBytes > 0
      ? ` and ${mebibytes(admittedBytes)} MiB are held for images admitted and not yet pulled`
      : ''
  return new CairnProblem(
    'images_quota_exceeded',
    `${what}: the shared images hold ${mebibytes(usage.usedBytes)} MiB of their ${mebibytes(usage.quotaBytes)} MiB (--images-quota-mib)${admitted}; images no revision uses are removed by retention`,
    { quotaBytes: usage.quotaBytes, usedBytes: usage.usedBytes, admittedBytes },
  )
}

/** How long an image admitted at deploy holds its room before its pull starts (then until it ends). */
export const IMAGE_ADMISSION_HOLD_MS = 60_000

/**
 * Room in the shared images' group promised to images admitted and not yet built: an OCI image's
 * declared bytes from its admission at deploy until its pull ends (built, it counts in the group's
 * own figure; failed, it is gone), so concurrent deploys of new images cannot each pass the same
 * check. An admission whose pull never starts (its deploy was refused after it) lapses after
 * `IMAGE_ADMISSION_HOLD_MS`. A Debian build declares nothing: it needs room left and holds none.
 */
export class ImagesAdmissions {
  private readonly held = new Map<string, { bytes: number; untilMs: number }>()

  constructor(private readonly nowMs: () => number = Date.now) {}

  /**
   * Admits the image `key` needing `neededBytes`, or refuses it (`images_quota_exceeded`) when the
   * group's figure and the room held for other images leave less. The figure is read first; the
   * check and the hold then happen with no await between them.
   */
  async admit(source: ImagesRoomSource, key: string, neededBytes: number, what: string): Promise<void> {
    const usage = await source.usage()
    if (!usage) return
    const now = this.nowMs()
    let heldBytes = 0
    for (const [other, hold] of this.held) {
      if (hold.untilMs <= now) this.held.delete(other)
      else if (other !== key) heldBytes += hold.bytes
    }
    if (usage.usedBytes + heldBytes + Math.max(1, neededBytes) > usage.quotaBytes)
      throw imagesFull(`${what} does not fit`, usage, heldBytes)
    const untilMs = Math.max(this.held.get(key)?.untilMs ?? 0, now + IMAGE_ADMISSION_HOLD_MS)
    this.held.set(key, { bytes: Math.max(neededBytes, this.held.get(key)?.bytes ?? 0), untilMs })
  }

  /** The image's pull started: its room is held until `release`. */
  pulling(key: string): void {
    const hold = this.held.get(key)
    if (hold) hold.untilMs = Number.POSITIVE_INFINITY
  }

  /** The image's pull ended (built or failed): its room is the group's figure's, or free again. */
  release(key: string): void {
    this.held.delete(key)
  }

  /** The room held for images admitted and not yet built. */
  heldBytes(): number {
    const now = this.nowMs()
    let total = 0
    for (const hold of this.held.values()) if (hold.untilMs > now) total += hold.bytes
    return total
  }
}

/**
 * What a failed build or pull is answered with: `images_quota_exceeded` when the images' group
 * stopped it (its tools' `Disk quota exceeded`, or the group within a write of its limit; asked
 * before its staging tree is discarded), else the failure itself.
 */
export async function namedImagesFailure(source: ImagesRoomSource, error: unknown, what: string) {
  const usage = await source.usage().catch(() => undefined)
  if (!usage || (error instanceof CairnProblem && error.code === 'images_quota_exceeded')) return error
  const quotaHit = /quota exceeded/i.test(String((error as Error)?.message))
  const slackBytes = Math.min(FULL_SLACK_BYTES, usage.quotaBytes / 8)
  if (quotaHit || usage.quotaBytes - usage.usedBytes < slackBytes)
    return imagesFull(`${what} stopped at the images' limit`, usage)
  return error
}
