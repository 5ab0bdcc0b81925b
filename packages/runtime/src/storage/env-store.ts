import { existsSync } from 'node:fs'
import { chmod, mkdir } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import type { DependencyEnv } from '../launch/launch-env.js'
import { execTool } from '../util/exec.js'
import type { StoragePool } from './pool.js'

const KEY_PATTERN = /^[a-z]+-[0-9a-f]{16,64}$/

/**
 * Dependency environments: read-only trees keyed by the hash of the tenant and its lockfile, built
 * once and mounted read-only into every sandbox of every revision of that tenant that shares the
 * lockfile. Each counts in its tenant's quota group, where its install (the tenant's own scripts)
 * writes.
 */
export class EnvStore {
  constructor(
    private readonly pool: StoragePool,
    private readonly sandboxUid: number,
  ) {}

  private get dir(): string {
    return path.join(this.pool.root, 'envs')
  }

  envPath(key: string): string {
    if (!KEY_PATTERN.test(key)) throw new CairnProblem('bad_request', `invalid environment key '${key}'`)
    return path.join(this.dir, key)
  }

  /** The dependency environment `key` names, for a launch (none without a key). */
  dependency(key: string | undefined): DependencyEnv | undefined {
    return key ? { key, dir: this.envPath(key) } : undefined
  }

  async has(key: string): Promise<boolean> {
    return existsSync(this.envPath(key))
  }

  /** A writable subvolume of `tenantId`'s, owned by the sandbox uid, to install dependencies into. */
  async createStaging(key: string, buildId: string, tenantId: string): Promise<string> {
    this.envPath(key)
    const staging = await this.pool.createStaging(buildId, tenantId)
    await execTool('chown', [`${this.sandboxUid}:${this.sandboxUid}`, staging], { code: 'storage_error' })
    return staging
  }

  /** Seals a built environment read-only under its key (first writer wins on a race). */
  async seal(staging: string, key: string, tenantId: string): Promise<void> {
    await mkdir(this.dir, { recursive: true })
    await chmod(this.dir, 0o711)
    const target = this.envPath(key)
    if (existsSync(target)) {
      await this.pool.discardStaging(staging)
      return
    }
    await chmod(staging, 0o755)
    await this.pool.sealStaging(staging, target, tenantId)
  }
}
