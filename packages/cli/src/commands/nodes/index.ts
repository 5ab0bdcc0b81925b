import type { NodeSummary } from '@cairn/sdk'
import { duration, jsonOption, type Register } from '../../command.js'
import { CliError } from '../../errors.js'
import { oneLine } from '../../format/sanitize.js'
import { renderTable } from '../../format/table.js'
import { formatBytes, relativeTime } from '../../format/time.js'

/** How often `drain` looks whether the node is drained. */
const DRAIN_POLL_MS = 1000
const DEFAULT_DRAIN_TIMEOUT_MS = 10 * 60 * 1000

function nodeRows(nodes: NodeSummary[], now: Date): string[][] {
  return nodes.map((n) => [
    n.id,
    oneLine(n.name, 30),
    n.state + (n.leaseLive || n.state === 'lost' || n.state === 'stopped' ? '' : ' (lease ended)'),
    String(n.epoch),
    String(n.sessions),
    String(n.runningTurns),
    `${n.warmSandboxes}/${n.cpus}`,
    n.poolFreeBytes === undefined ? '-' : formatBytes(n.poolFreeBytes),
    relativeTime(n.heartbeatAt, now),
    oneLine(n.address, 40),
  ])
}

const HEADERS = [
  'ID',
  'Name',
  'State',
  'Epoch',
  'Sessions',
  'Turns',
  'Warm/CPUs',
  'Pool free',
  'Heartbeat',
  'Address',
]

export const register: Register = (parent, ctx) => {
  const nodes = parent
    .command('nodes')
    .description(
      "The cluster's runtime nodes: list, cordon, uncordon, drain (needs an admin key of the install)",
    )
  jsonOption(
    nodes
      .command('list', { isDefault: true })
      .alias('ls')
      .description(
        'List the nodes: state, epoch, sessions, running turns, warm sandboxes, pool space, last heartbeat',
      ),
  ).action(async () => {
    const list = await (await ctx.client()).nodes.list()
    if (ctx.json) return ctx.out.data(list)
    if (list.length === 0) {
      ctx.out.note('No nodes: this server is not in a cluster, or no `cairn node` has registered yet.')
      return
    }
    ctx.out.line(renderTable(HEADERS, nodeRows(list, new Date()), ctx.out.c.bold))
  })
  for (const [action, description] of [
    ['cordon', 'Cordon a node: it keeps its sessions and takes no new ones'],
    ['uncordon', 'Uncordon a node (cordoned or draining): it takes new sessions again'],
  ] as const)
    jsonOption(nodes.command(`${action} <node>`).description(description)).action(async (id: string) => {
      const node = await (await ctx.client()).nodes.apply(id, action)
      if (ctx.json) return ctx.out.data(node)
      ctx.out.note(`Node ${node.id} (${oneLine(node.name, 30)}) is ${node.state}`)
    })
  jsonOption(
    nodes
      .command('drain <node>')
      .description(
        "Drain a node: it takes no new sessions; the cluster's leader moves its sessions to other nodes as their turns end; waits until it owns no session and runs no turn",
      )
      .option('--no-wait', 'return once the node is draining, without waiting for its sessions to be moved')
      .option(
        '--timeout <duration>',
        'give up waiting after this long (exit 1), e.g. 90s, 10m (default 10m)',
        duration,
      ),
  ).action(async (id: string, options: { wait: boolean; timeout?: number }) => {
    const client = await ctx.client()
    let node = await client.nodes.drain(id)
    if (options.wait) {
      const until = Date.now() + (options.timeout ?? DEFAULT_DRAIN_TIMEOUT_MS)
      while (node.runningTurns > 0 || node.sessions > 0) {
        if (Date.now() > until)
          throw new CliError(
            `node ${node.id} still owns ${node.sessions} session(s) and runs ${node.runningTurns} turn(s)`,
            {
              hint: 'wait longer (--timeout), or cancel those turns; sessions are moved by the leader of a cluster of API replicas (--role api)',
              code: 'timeout',
            },
          )
        if (!ctx.json)
          ctx.out.note(
            `Waiting: ${node.id} owns ${node.sessions} session(s), runs ${node.runningTurns} turn(s)…`,
          )
        await new Promise((resolve) => setTimeout(resolve, DRAIN_POLL_MS))
        const now = (await client.nodes.list()).find((n) => n.id === id)
        if (!now) throw new CliError(`node ${id} is gone from the cluster`)
        if (now.state !== 'draining')
          throw new CliError(`node ${id} is ${now.state} now, no longer draining`, { hint: 'drain it again' })
        node = now
      }
    }
    if (ctx.json) return ctx.out.data(node)
    ctx.out.note(
      options.wait
        ? `Node ${node.id} is drained: its sessions were moved to other nodes and no turn runs on it`
        : `Node ${node.id} is draining (${node.sessions} session(s) to move, ${node.runningTurns} turn(s) running)`,
    )
  })
}
