import type { RuntimePort } from '@cairn/runtime/port'
import type { Selectable } from 'kysely'
import type { Db } from '../../db/database.js'
import type { NodesTable } from '../../db/schema.js'

/** A `nodes` row as read. */
export type NodeRow = Selectable<NodesTable>

/** How the API replica reaches a node: its runtime port, made from its row (address, epoch). */
export type ConnectNode = (row: NodeRow) => RuntimePort & { close?: () => Promise<void> | void }

/** The cluster's nodes as the routing port sees them: their rows, and a port to each. */
export interface NodeDirectory {
  /** Every registered node's row, read at most `cacheMs` ago (`fresh`: read now). */
  nodes(fresh?: boolean): Promise<NodeRow[]>
  /** The node's row, or undefined when no node of that ID is registered. */
  node(id: string): Promise<NodeRow | undefined>
  /** The port to the node (one per node and registration, reused). */
  port(row: NodeRow): RuntimePort
  close(): Promise<void>
}

/**
 * The `nodes` table, read at most every `cacheMs` (a node's row changes on registration, state
 * changes and heartbeats: the figures placement uses may be a heartbeat old, the state a moment
 * old). Ports are made by `connect` (`RemoteRuntimePort` in production) and remade when the node
 * registers again (a new epoch or address).
 */
export class DatabaseNodeDirectory implements NodeDirectory {
  private cached: { atMs: number; rows: NodeRow[] } | undefined
  private reading: Promise<NodeRow[]> | undefined
  private readonly ports = new Map<string, { key: string; port: ReturnType<ConnectNode> }>()

  constructor(
    private readonly db: Db,
    private readonly connect: ConnectNode,
    private readonly options: { cacheMs?: number | undefined; now?: (() => number) | undefined } = {},
  ) {}

  private now(): number {
    return this.options.now?.() ?? Date.now()
  }

  async nodes(fresh = false): Promise<NodeRow[]> {
    const cacheMs = this.options.cacheMs ?? 1000
    if (!fresh && this.cached && this.now() - this.cached.atMs < cacheMs) return this.cached.rows
    // Concurrent readers share one query.
    this.reading ??= (async () => {
      try {
        const rows = await this.db.q.selectFrom('nodes').selectAll().orderBy('id').execute()
        this.cached = { atMs: this.now(), rows }
        return rows
      } finally {
        this.reading = undefined
      }
    })()
    return this.reading
  }

  async node(id: string): Promise<NodeRow | undefined> {
    const cachedRow = (await this.nodes()).find((row) => row.id === id)
    // A node registered since the last read is looked for again before it is said to be unknown.
    return cachedRow ?? (await this.nodes(true)).find((row) => row.id === id)
  }

  port(row: NodeRow): RuntimePort {
    const key = `${row.address} ${row.epoch}`
    const known = this.ports.get(row.id)
    if (known?.key === key) return known.port
    if (known) void Promise.resolve(known.port.close?.()).catch(() => undefined)
    const port = this.connect(row)
    this.ports.set(row.id, { key, port })
    return port
  }

  async close(): Promise<void> {
    const ports = [...this.ports.values()]
    this.ports.clear()
    await Promise.all(ports.map(({ port }) => Promise.resolve(port.close?.()).catch(() => undefined)))
  }
}
