import { existsSync } from 'node:fs'
import { chmod, mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import type { ImagesUsage, StoragePool } from '../storage/pool.js'
import { execTool } from '../util/exec.js'

const KEY_PATTERN = /^(debian|oci)-[0-9a-f]{32,64}$/

/** What is recorded beside each built image (`<key>.json`). */
export interface ImageRecord {
  key: string
  kind: 'debian' | 'oci'
  /** The recipe as written (`debian:bookworm + git, ripgrep from …`) or the OCI reference pulled. */
  source: string
  /** The OCI manifest digest; for a Debian image the sha256 of its recipe. */
  digest: string
  sizeBytes: number
  builtAt: string
  buildMs: number
}

/**
 * Built images: read-only root filesystems under `<pool>/images/<key>/rootfs` (a read-only btrfs
 * subvolume per image on a btrfs pool), keyed by their recipe's hash or their digest and shared by
 * every revision that names the same one.
 */
export class ImageStore {
  constructor(private readonly pool: StoragePool) {}

  get dir(): string {
    return path.join(this.pool.root, 'images')
  }

  imagePath(key: string): string {
    if (!KEY_PATTERN.test(key)) throw new CairnProblem('bad_request', `invalid image key '${key}'`)
    return path.join(this.dir, key)
  }

  /** The host path of the image's root filesystem (what a sandbox's overlay has below). */
  rootfsPath(key: string): string {
    return path.join(this.imagePath(key), 'rootfs')
  }

  has(key: string): boolean {
    return existsSync(this.imagePath(key)) && existsSync(`${this.imagePath(key)}.json`)
  }

  /** A fresh writable tree in the pool's staging area to build the image in (in the images' group). */
  createStaging(buildId: string): Promise<string> {
    return this.pool.createImageStaging(buildId)
  }

  /** What the images hold and may hold together; undefined where the pool enforces no limit. */
  usage(): Promise<ImagesUsage | undefined> {
    return this.pool.imagesUsage()
  }

  discardStaging(staging: string): Promise<void> {
    return this.pool.discardStaging(staging)
  }

  /** Seals a built tree read-only under its key and records it (first writer wins on a race). */
  async seal(staging: string, record: ImageRecord): Promise<void> {
    await mkdir(this.dir, { recursive: true })
    await chmod(this.dir, 0o711)
    const target = this.imagePath(record.key)
    if (this.has(record.key)) {
      await this.pool.discardStaging(staging)
      return
    }
    await chmod(staging, 0o755)
    if (existsSync(target)) await this.removeTree(target)
    await this.pool.sealImageStaging(staging, target)
    const tmp = `${target}.json.${process.pid}.tmp`
    await writeFile(tmp, `${JSON.stringify(record, null, 2)}\n`, { mode: 0o644 })
    await rename(tmp, `${target}.json`)
  }

  async get(key: string): Promise<ImageRecord | undefined> {
    if (!this.has(key)) return undefined
    return JSON.parse(await readFile(`${this.imagePath(key)}.json`, 'utf8')) as ImageRecord
  }

  async list(): Promise<ImageRecord[]> {
    if (!existsSync(this.dir)) return []
    const records: ImageRecord[] = []
    for (const name of await readdir(this.dir)) {
      const key = name.endsWith('.json') ? name.slice(0, -5) : undefined
      if (!key || !KEY_PATTERN.test(key)) continue
      const record = await this.get(key)
      if (record) records.push(record)
    }
    return records.sort((a, b) => a.builtAt.localeCompare(b.builtAt))
  }

  /** Removes an image (its record first: a half-removed image is never taken for a built one). */
  async remove(key: string): Promise<void> {
    const target = this.imagePath(key)
    await rm(`${target}.json`, { force: true })
    if (existsSync(target)) await this.removeTree(target)
  }

  private async removeTree(target: string): Promise<void> {
    if (this.pool.driver === 'btrfs') {
      await execTool('btrfs', ['subvolume', 'delete', target], { code: 'storage_error' })
      return
    }
    await rm(target, { recursive: true, force: true })
  }
}
