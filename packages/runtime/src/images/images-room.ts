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
export function imagesFull(what: string, usage: ImagesUsage): CairnProblem {
  return new CairnProblem(
    'images_quota_exceeded',
    `${what}: the shared images hold ${mebibytes(usage.usedBytes)} MiB of their ${mebibytes(usage.quotaBytes)} MiB (--images-quota-mib); images no revision uses are removed by retention`,
    { quotaBytes: usage.quotaBytes, usedBytes: usage.usedBytes },
  )
}

/**
 * Refuses a build or pull before it starts when the images' group cannot take `neededBytes` more
 * (an OCI image's declared layers; a Debian build declares nothing, so it needs some room left).
 */
export async function checkImagesRoom(source: ImagesRoomSource, neededBytes: number, what: string) {
  const usage = await source.usage()
  if (usage && usage.usedBytes + Math.max(1, neededBytes) > usage.quotaBytes)
    throw imagesFull(`${what} does not fit`, usage)
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
