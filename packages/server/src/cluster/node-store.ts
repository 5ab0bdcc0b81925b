import { CairnProblem, type NodeAction, type NodeInfo, type NodeState } from '@cairn/protocol'
import { type CompiledQuery, sql } from 'kysely'
import type { Db } from '../db/database.js'
import type { NodesTable } from '../db/schema.js'
import { dbTime } from './db-time.js'

/** States in which a node holds a lease (and renews it). */
export const LEASED_STATES: readonly NodeState[] = ['ready', 'cordoned', 'draining']

/** What a node tells about itself when it registers and at each heartbeat. */
export interface NodeFigures {
  drivers: string[]
  cpus: number
  warmSandboxes: number
  poolFreeBytes: number | undefined
  poolSizeBytes: number | undefined
}

export interface NodeRegistration {
  id: string
  name: string
  address: string
  bootId: string
  figures: NodeFigures
  leaseMs: number
}

type NodeRow = Omit<NodesTable, 'warm_sandboxes'> & { warm_sandboxes: number }

/** The states an operator's action moves a node from, and to. */
const ACTIONS: Record<NodeAction, { from: readonly NodeState[]; to: NodeState }> = {
  cordon: { from: ['ready', 'draining'], to: 'cordoned' },
  uncordon: { from: ['cordoned', 'draining'], to: 'ready' },
  drain: { from: ['ready', 'cordoned'], to: 'draining' },
}

/** Runs a compiled statement somewhere else than the pool (a node's own connection); its rows. */
export type RunCompiled = <R>(query: CompiledQuery<R>) => Promise<R[]>

/**
 * The `nodes` table (PostgreSQL only: a cluster needs it). Times are the database's. A node's
 * own writes (register, renew, deregister) go through the functions its role may call
 * (node-role.ts: they check the row is the calling role's) and may run on its dedicated
 * connection (`run`), whose statements time out, so a partition is seen as a failure, never as a
 * wait.
 */
export class NodeStore {
  constructor(
    private readonly db: Db,
    private readonly run?: RunCompiled,
  ) {}

  private async rows<R>(query: CompiledQuery<R>): Promise<R[]> {
    if (this.run) return this.run(query)
    return (await this.db.q.executeQuery(query)).rows
  }

  /**
   * Registers a node (a new incarnation: `epoch` one more than the last). An operator's cordon
   * outlives a restart; a drain is the incarnation's way down (every stop drains first), so the
   * next one is ready, as is a node that was lost or stopped. Its sessions stay
   * its own (their `runtime_id`), so they are served again.
   */
  async register(node: NodeRegistration): Promise<{ epoch: number; state: NodeState }> {
    const f = node.figures
    const [row] = await this.rows(
      sql<{
        node_epoch: number
        node_state: string
      }>`SELECT node_epoch, node_state FROM cairn_node_register(${node.id}, ${node.name}, ${node.address}, ${node.bootId}, ${JSON.stringify(f.drivers)}, ${f.cpus}::bigint, ${f.warmSandboxes}::bigint, ${f.poolFreeBytes ?? null}::bigint, ${f.poolSizeBytes ?? null}::bigint, ${node.leaseMs}::bigint)`.compile(
        this.db.kysely,
      ),
    )
    if (!row) throw new Error(`registering node ${node.id} returned no row`)
    return { epoch: Number(row.node_epoch), state: row.node_state as NodeState }
  }

  /**
   * Renews the lease of incarnation `epoch`, with the node's figures. Answers undefined when that
   * incarnation no longer holds a lease (declared lost, stopped, or a newer one registered): the
   * node then fences itself. A late heartbeat changes nothing.
   */
  async renew(
    id: string,
    epoch: number,
    leaseMs: number,
    figures: Pick<NodeFigures, 'warmSandboxes' | 'poolFreeBytes'>,
  ): Promise<NodeState | undefined> {
    const [row] = await this.rows(
      sql<{
        state: string | null
      }>`SELECT cairn_node_renew(${id}, ${epoch}::bigint, ${leaseMs}::bigint, ${figures.warmSandboxes}::bigint, ${figures.poolFreeBytes ?? null}::bigint) AS state`.compile(
        this.db.kysely,
      ),
    )
    return (row?.state ?? undefined) as NodeState | undefined
  }

  /** A clean shutdown: the incarnation's lease ends now, state `stopped`. */
  async deregister(id: string, epoch: number): Promise<boolean> {
    const [row] = await this.rows(
      sql<{ stopped: boolean }>`SELECT cairn_node_deregister(${id}, ${epoch}::bigint) AS stopped`.compile(
        this.db.kysely,
      ),
    )
    return row?.stopped === true
  }

  /** An operator's cordon, uncordon or drain; a lost or stopped node cannot be moved. */
  async apply(id: string, action: NodeAction): Promise<NodeInfo> {
    const { from, to } = ACTIONS[action]
    const current = await this.get(id)
    if (current.state !== to) {
      const result = await this.db.q
        .updateTable('nodes')
        .set({ state: to })
        .where('id', '=', id)
        .where('state', 'in', from)
        .executeTakeFirst()
      if (Number(result.numUpdatedRows) === 0)
        throw new CairnProblem('conflict', `node ${id} is ${current.state}: it cannot ${action}`, {
          nodeId: id,
          state: current.state,
        })
    }
    return this.get(id)
  }

  async get(id: string): Promise<NodeInfo> {
    const node = (await this.list(id))[0]
    if (!node) throw new CairnProblem('not_found', `no node ${id}`, { nodeId: id })
    return node
  }

  /** Every node (or one), with its sessions counted and whether its lease runs now. */
  async list(id?: string): Promise<NodeInfo[]> {
    let query = this.db.q
      .selectFrom('nodes as n')
      .selectAll('n')
      .select((eb) => [
        eb
          .selectFrom('sessions as s')
          .select(eb.fn.countAll<number>().as('c'))
          .whereRef('s.runtime_id', '=', 'n.id')
          .where('s.status', '!=', 'deleted')
          .as('sessions'),
        eb
          .selectFrom('turns as t')
          .innerJoin('sessions as s', 's.id', 't.session_id')
          .select(eb.fn.countAll<number>().as('c'))
          .whereRef('s.runtime_id', '=', 'n.id')
          .where('t.status', '=', 'running')
          .as('running_turns'),
        sql<boolean>`n.lease_expires_at > ${dbTime()}`.as('lease_live'),
      ])
      .orderBy('n.name')
      .orderBy('n.id')
    if (id !== undefined) query = query.where('n.id', '=', id)
    const rows = await query.execute()
    return rows.map((row) =>
      toInfo(row as NodeRow, {
        sessions: Number(row.sessions ?? 0),
        runningTurns: Number(row.running_turns ?? 0),
        leaseLive: Boolean(row.lease_live),
      }),
    )
  }

  /** Nodes that hold a lease, with whether it ended (in the database's time). */
  async leased(): Promise<{ id: string; epoch: number; state: NodeState; expired: boolean }[]> {
    const rows = await this.db.q
      .selectFrom('nodes')
      .select(['id', 'epoch', 'state', sql<boolean>`lease_expires_at <= ${dbTime()}`.as('expired')])
      .where('state', 'in', LEASED_STATES)
      .execute()
    return rows.map((r) => ({ id: r.id, epoch: r.epoch, state: r.state as NodeState, expired: r.expired }))
  }
}

function toInfo(
  row: NodeRow,
  counts: { sessions: number; runningTurns: number; leaseLive: boolean },
): NodeInfo {
  return {
    id: row.id,
    name: row.name,
    address: row.address,
    bootId: row.boot_id,
    state: row.state as NodeState,
    drivers: JSON.parse(row.drivers) as string[],
    cpus: row.cpus,
    warmSandboxes: row.warm_sandboxes,
    ...(row.pool_free_bytes === null ? {} : { poolFreeBytes: row.pool_free_bytes }),
    ...(row.pool_size_bytes === null ? {} : { poolSizeBytes: row.pool_size_bytes }),
    epoch: row.epoch,
    ...counts,
    leaseExpiresAt: row.lease_expires_at,
    heartbeatAt: row.heartbeat_at,
    registeredAt: row.registered_at,
    ...(row.lost_at === null ? {} : { lostAt: row.lost_at }),
  }
}
