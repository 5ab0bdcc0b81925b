import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { chmod, mkdir, rename, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import type { SandboxBind } from '../sandbox/driver.js'

const AGENT_ID_PATTERN = /^agt_[0-9a-z]+$/

/**
 * Agents' memory where sandboxes mount it (`<root>/<agentId>/MEMORY.md` and `VERSION`, read-only
 * at /memory): the server publishes each version, sandboxes name the agent.
 */
export class MemoryMounts {
  /** Memory version last written for each agent. */
  private readonly written = new Map<string, number>()

  constructor(private readonly root: string) {}

  private dir(agentId: string): string {
    if (!AGENT_ID_PATTERN.test(agentId))
      throw new CairnProblem('bad_request', `invalid agent ID '${agentId}'`)
    return path.join(this.root, agentId)
  }

  /**
   * Many sandboxes of one agent start at once: written only when the version changed, through a
   * temporary file of this call's own, so a reader never sees a half-written file.
   */
  async publish(agentId: string, version: number, content: string): Promise<void> {
    const dir = this.dir(agentId)
    if (this.written.get(agentId) === version && existsSync(path.join(dir, 'MEMORY.md'))) return
    await mkdir(dir, { recursive: true })
    await chmod(this.root, 0o711)
    await chmod(dir, 0o755)
    const tmp = path.join(dir, `.MEMORY.${randomBytes(8).toString('hex')}.tmp`)
    await writeFile(tmp, content, { mode: 0o644 })
    await rename(tmp, path.join(dir, 'MEMORY.md'))
    const versionTmp = path.join(dir, `.VERSION.${randomBytes(8).toString('hex')}.tmp`)
    await writeFile(versionTmp, `${version}\n`, { mode: 0o644 })
    await rename(versionTmp, path.join(dir, 'VERSION'))
    this.written.set(agentId, version)
  }

  /** The read-only mount of the agent's published memory (`not_found` when none was published). */
  bind(agentId: string): SandboxBind {
    const dir = this.dir(agentId)
    if (!existsSync(path.join(dir, 'MEMORY.md')))
      throw new CairnProblem('internal', `no memory was published for agent ${agentId}`)
    return { source: dir, dest: '/memory', readOnly: true }
  }
}
