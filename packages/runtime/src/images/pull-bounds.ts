import { lstat, readdir } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'

/** How often a build's or pull's staging tree is measured while its tool writes. */
const WATCH_INTERVAL_MS = 25

function mebibytes(bytes: number): string {
  return (bytes / 1024 / 1024).toFixed(1)
}

/** The typed refusal of an image past the operator's maximum, naming it. */
export function imageTooLarge(what: string, maxBytes: number): CairnProblem {
  return new CairnProblem(
    'image_too_large',
    `${what} more than the operator's maximum image size of ${mebibytes(maxBytes)} MiB (--max-image-mib)`,
    { maxBytes },
  )
}

interface Descriptor {
  digest?: string
  size?: unknown
  platform?: { os?: string; architecture?: string }
}

interface RawManifest {
  manifests?: Descriptor[]
  config?: Descriptor
  layers?: Descriptor[]
}

/** The OCI architecture name of this host. */
export function hostArchitecture(): string {
  return process.arch === 'x64' ? 'amd64' : process.arch
}

/**
 * The manifest an index names for this host (what `skopeo copy` pulls from it), or undefined when
 * `raw` is an image manifest already.
 */
export function platformManifestDigest(raw: RawManifest): string | undefined {
  if (!Array.isArray(raw.manifests)) return undefined
  const entry = raw.manifests.find(
    (m) => m.platform?.os === 'linux' && m.platform.architecture === hostArchitecture(),
  )
  if (!entry?.digest)
    throw new CairnProblem('build_failed', `the image's index names no linux/${hostArchitecture()} manifest`)
  return entry.digest
}

/**
 * The bytes an image manifest declares (its config and layers, as the registry will send them):
 * refused past `maxBytes` before anything is downloaded, and when a size is missing.
 */
export function checkDeclaredBytes(raw: RawManifest, maxBytes: number): number {
  const blobs = [raw.config, ...(raw.layers ?? [])]
  let total = 0
  for (const blob of blobs) {
    const size = blob?.size
    if (typeof size !== 'number' || !Number.isSafeInteger(size) || size < 0)
      throw new CairnProblem('build_failed', 'the image manifest declares a blob without a size')
    total += size
  }
  if (total > maxBytes)
    throw imageTooLarge(`the image's registry declares ${mebibytes(total)} MiB,`, maxBytes)
  return total
}

/** Bytes a tree holds on disk (a file's apparent size or its allocated blocks, the larger). */
export async function treeBytes(dir: string): Promise<number> {
  let total = 0
  const entries = await readdir(dir, { withFileTypes: true }).catch(() => [])
  for (const entry of entries) {
    const at = path.join(dir, entry.name)
    if (entry.isDirectory()) {
      total += await treeBytes(at)
      continue
    }
    const info = await lstat(at).catch(() => undefined)
    if (info) total += Math.max(info.size, info.blocks * 512)
  }
  return total
}

/**
 * Watches `dir` while a tool writes into it and aborts the returned signal (its reason an
 * `image_too_large` problem) once the tree holds more than `maxBytes`: what a registry sends is
 * cut at the cap whatever its manifest declared. `stop` ends the watch.
 */
export function watchTreeBytes(
  dir: string,
  maxBytes: number,
  what: string,
): { signal: AbortSignal; stop: () => void } {
  const controller = new AbortController()
  let stopped = false
  const measure = async () => {
    if (stopped) return
    if ((await treeBytes(dir)) > maxBytes) {
      controller.abort(imageTooLarge(`${what} wrote`, maxBytes))
      return
    }
    if (!stopped) timer = setTimeout(measure, WATCH_INTERVAL_MS)
  }
  let timer = setTimeout(measure, WATCH_INTERVAL_MS)
  return {
    signal: controller.signal,
    stop: () => {
      stopped = true
      clearTimeout(timer)
    },
  }
}
