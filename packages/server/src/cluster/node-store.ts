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
 * own writes (register, renew, deregister) may run on its dedicated connection (`run`), whose
 * statements time out, so a partition is seen as a failure, never as a wait.
 */
export class NodeStore {
  constructor(
    private readonly db: Db,
    private readonly run?: RunCompiled,
  ) {}

  private rows<R>(query: { compile(): CompiledQuery<R>; execute(): Promise<R[]> }): Promise<R[]> {
    return this.run ? this.run(query.compile()) : query.execute()
  }

  /**
   * Registers a node (a new incarnation: `epoch` one more than the last). An operator's cordon or
   * drain outlives a restart; a node that was lost or stopped is ready again. Its sessions stay
   * its own (their `runtime_id`), so they are served again.
   */
  async register(node: NodeRegistration): Promise<{ epoch: number; state: NodeState }> {
    const lease = dbTime(node.leaseMs)
    const query = this.db.kysely
      .insertInto('nodes')
      .values({
        id: node.id,
        name: node.name,
        address: node.address,
        boot_id: node.bootId,
        state: 'ready',
        drivers: JSON.stringify(node.figures.drivers),
        cpus: node.figures.cpus,
        warm_sandboxes: node.figures.warmSandboxes,
        pool_free_bytes: node.figures.poolFreeBytes ?? null,
        pool_size_bytes: node.figures.poolSizeBytes ?? null,
        epoch: 1,
        lease_expires_at: lease,
        heartbeat_at: dbTime(),
        registered_at: dbTime(),
        lost_at: null,
      })
      .onConflict((oc) =>
        oc.column('id').doUpdateSet((eb) => ({
          name: eb.ref('excluded.name'),
          address: eb.ref('excluded.address'),
          boot_id: eb.ref('excluded.boot_id'),
          state: sql<string>`CASE WHEN nodes.state IN ('cordoned', 'draining') THEN nodes.state ELSE 'ready' END`,
          drivers: eb.ref('excluded.drivers'),
          cpus: eb.ref('excluded.cpus'),
          warm_sandboxes: eb.ref('excluded.warm_sandboxes'),
          pool_free_bytes: eb.ref('excluded.pool_free_bytes'),
          pool_size_bytes: eb.ref('excluded.pool_size_bytes'),
          epoch: sql<number>`nodes.epoch + 1`,
          lease_expires_at: eb.ref('excluded.lease_expires_at'),
          heartbeat_at: eb.ref('excluded.heartbeat_at'),
          registered_at: eb.ref('excluded.registered_at'),
          lost_at: null,
        })),
      )
      .returning(['epoch', 'state'])
    const [row] = await this.rows(query)
    if (!row) throw new Error(`registering node ${node.id} returned no row`)
    return { epoch: Number(row.epoch), state: row.state as NodeState }
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
    const query = this.db.kysely
      .updateTable('nodes')
      .set({
        lease_expires_at: dbTime(leaseMs),
        heartbeat_at: dbTime(),
        warm_sandboxes: figures.warmSandboxes,
        pool_free_bytes: figures.poolFreeBytes ?? null,
      })
      .where('id', '=', id)
      .where('epoch', '=', epoch)
      .where('state', 'in', LEASED_STATES)
      .returning('state')
    const [row] = await this.rows(query)
    return row?.state as NodeState | undefined
  }

  /** A clean shutdown: the incarnation's lease ends now, state `stopped`. */
  async deregister(id: string, epoch: number): Promise<boolean> {
    const query = this.db.kysely
      .updateTable('nodes')
      .set({ state: 'stopped', lease_expires_at: dbTime() })
      .where('id', '=', id)
      .where('epoch', '=', epoch)
      .where('state', 'in', LEASED_STATES)
      .returning('id')
    return (await this.rows(query)).length > 0
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
