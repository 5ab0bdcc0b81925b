import { execTool } from '../util/exec.js'

/** Tries of a listing that met a quota group deleted while it was listed. */
const QGROUP_SHOW_TRIES = 5

/**
 * `btrfs qgroup show ARGS`, tried again when a quota group went away while it was listed (a
 * snapshot or workspace deleted meanwhile: btrfs-progs lists the groups, then looks each one up,
 * and answers "cannot find the qgroup 0/N" for one deleted in between). Every other failure is
 * the caller's `storage_error`, as before.
 */
export async function showQgroups(args: readonly string[]): Promise<{ stdout: string; stderr: string }> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await execTool('btrfs', ['qgroup', 'show', ...args], { code: 'storage_error' })
    } catch (error) {
      if (attempt >= QGROUP_SHOW_TRIES || !/cannot find the qgroup/i.test(String((error as Error).message)))
        throw error
    }
  }
}

/** One quota group as `btrfs qgroup show -pcre --raw` lists it. */
export interface QgroupRow {
  id: string
  /** Its exclusive limit in bytes (undefined: none). */
  maxExclusiveBytes: number | undefined
  parents: string[]
}

/** A subvolume of the pool, its level-0 group and the level-1 group that owns it. */
export interface PoolTree {
  path: string
  qgroup: string
  owner: string | undefined
}

/** The pool's groups the invariant names: the agents' (level 2), the images', and no tenant's. */
export interface OwnerGroups {
  agents: string
  images: string
  noTenant: string
  /** The tenant quota each tenant's group is limited to (undefined: tenants have no own limit). */
  tenantQuotaBytes: number | undefined
}

/** Parses `btrfs qgroup show -pcre --raw` (id, referenced, exclusive, max referenced, max exclusive, parents, …). */
export function parseQgroups(stdout: string): Map<string, QgroupRow> {
  const groups = new Map<string, QgroupRow>()
  for (const line of stdout.split('\n')) {
    const [id, , , , maxExclusive, parents] = line.trim().split(/\s+/)
    if (!id || !/^\d+\/\d+$/.test(id)) continue
    groups.set(id, {
      id,
      maxExclusiveBytes: maxExclusive && /^\d+$/.test(maxExclusive) ? Number(maxExclusive) : undefined,
      parents: parents && parents !== '-' ? parents.split(',') : [],
    })
  }
  return groups
}

/** Every subvolume of the pool at `mountPoint` with its level-0 group and its owner (its level-1 parent). */
export async function poolTrees(
  mountPoint: string,
): Promise<{ trees: PoolTree[]; groups: Map<string, QgroupRow> }> {
  const listed = await execTool('btrfs', ['subvolume', 'list', mountPoint], { code: 'storage_error' })
  const shown = await showQgroups(['-pcre', '--raw', mountPoint])
  const groups = parseQgroups(shown.stdout)
  const trees: PoolTree[] = []
  for (const line of listed.stdout.split('\n')) {
    const match = /^ID (\d+) .* path (.+)$/.exec(line.trim())
    if (!match?.[1] || !match[2]) continue
    const qgroup = `0/${match[1]}`
    const owners = (groups.get(qgroup)?.parents ?? []).filter((parent) => parent.startsWith('1/'))
    trees.push({
      path: match[2],
      qgroup,
      owner: owners.length === 1 ? owners[0] : owners.join(',') || undefined,
    })
  }
  return { trees, groups }
}

/**
 * The invariant "no tree in the pool without a limited owner", for a pool that enforces quotas:
 * every subvolume is in exactly one level-1 group, a tenant's or the shared images', never the
 * group of no tenant; that group is a member of the agents' group, which is limited (the pool
 * less its reserve); the images' group is limited (`--images-quota-mib`), and so is every tenant's
 * group when a tenant quota is set (without one, a tenant's group has no limit of its own and is
 * bounded by the agents' group alone). Returns the offenders, each named with what is wrong.
 */
export function unownedTrees(
  trees: PoolTree[],
  groups: Map<string, QgroupRow>,
  named: OwnerGroups,
): string[] {
  const offenders: string[] = []
  if (groups.get(named.agents)?.maxExclusiveBytes === undefined)
    offenders.push(`the agents' group ${named.agents} has no limit`)
  for (const tree of trees) {
    const owner = tree.owner
    const what = `${tree.path} (${tree.qgroup})`
    if (!owner) offenders.push(`${what} is in no group`)
    else if (owner.includes(',')) offenders.push(`${what} is in several groups: ${owner}`)
    else if (owner === named.noTenant) offenders.push(`${what} is in the group of no tenant ${owner}`)
    else if (!groups.get(owner)?.parents.includes(named.agents))
      offenders.push(`${what} is in ${owner}, outside the agents' group ${named.agents}`)
    else if (owner === named.images && groups.get(owner)?.maxExclusiveBytes === undefined)
      offenders.push(`${what} is in the images' group ${owner}, which has no limit`)
    else if (
      owner !== named.images &&
      named.tenantQuotaBytes !== undefined &&
      groups.get(owner)?.maxExclusiveBytes !== named.tenantQuotaBytes
    )
      offenders.push(`${what} is in ${owner}, not limited to the tenant quota ${named.tenantQuotaBytes}`)
  }
  return offenders
}
