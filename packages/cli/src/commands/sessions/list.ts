import type { SessionInfo } from '@cairn/protocol'
import { SESSION_STATUSES, type SessionStatus } from '@cairn/protocol/core'
import { InvalidArgumentError } from 'commander'
import { jsonOption, positiveInt, type Register } from '../../command.js'
import { UsageError } from '../../errors.js'
import { oneLine } from '../../format/sanitize.js'
import { SESSION_HEAD, sessionRow } from '../../format/session.js'
import { renderTable } from '../../format/table.js'

/**
 * Status names of hosted agent-session products that mean one of ours: a session "ended" by its
 * user is `completed` here.
 */
const STATUS_ALIASES: Readonly<Record<string, SessionStatus>> = { ended: 'completed' }

/** A status filter, any case; the aliases name ours. */
export function parseStatus(value: string): SessionStatus {
  const name = value.trim().toLowerCase()
  const status = STATUS_ALIASES[name] ?? name
  if (!(SESSION_STATUSES as readonly string[]).includes(status)) {
    const aliases = Object.entries(STATUS_ALIASES).map(([a, s]) => `${a} (= ${s})`)
    throw new InvalidArgumentError(`expected one of ${[...SESSION_STATUSES, ...aliases].join(', ')}`)
  }
  return status as SessionStatus
}

/**
 * A session as `--json` prints it: the API's record, plus `last_activity_at` (the same instant as
 * `lastActiveAt`) under the name the hosted products' cleanup recipes select on, so that a recipe
 * copied from their docs filters on a real date instead of on a missing field (which jq reads as
 * older than every date, selecting every session).
 */
function jsonRecord(s: SessionInfo): SessionInfo & { last_activity_at: string } {
  return { ...s, last_activity_at: s.lastActiveAt }
}

interface ListOptions {
  agent?: string
  status?: SessionStatus
  limit: number
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('list', { isDefault: true })
      .alias('ls')
      .description('List sessions, most recent first')
      .argument('[agent]', 'only sessions of this agent (name or ID); the same as --agent')
      .option('--agent <agent>', 'only sessions of this agent (name or ID)')
      .option(
        '--status <status>',
        `only sessions with this status (${SESSION_STATUSES.join(', ')}; ended = completed)`,
        parseStatus,
      )
      .option('--limit <n>', 'show at most n sessions', positiveInt, 50),
  ).action(async (positional: string | undefined, options: ListOptions) => {
    if (positional !== undefined && options.agent !== undefined && positional !== options.agent) {
      throw new UsageError(
        `Two agents given: '${positional}' and --agent '${options.agent}'`,
        'Name the agent once: `cairn sessions list my-agent`.',
      )
    }
    const agent = positional ?? options.agent
    const client = await ctx.client()
    const sessions: SessionInfo[] = []
    for await (const s of client.sessions.listAll({
      agent,
      status: options.status,
      limit: Math.min(options.limit, 500),
    })) {
      sessions.push(s)
      if (sessions.length >= options.limit) break
    }
    if (ctx.json) return ctx.out.data(sessions.map(jsonRecord))
    if (sessions.length === 0) {
      const filters = [
        agent !== undefined ? `agent '${oneLine(agent, 60)}'` : undefined,
        options.status !== undefined ? `status '${options.status}'` : undefined,
      ].filter((f) => f !== undefined)
      ctx.out.note(
        filters.length > 0
          ? `No session matches ${filters.join(' and ')}. See them all with \`cairn sessions list\`.`
          : 'No sessions yet. Start one with `cairn run <agent>`.',
      )
      return
    }
    const now = new Date()
    ctx.out.line(
      renderTable(
        SESSION_HEAD,
        sessions.map((s) => sessionRow(s, now)),
        ctx.out.c.bold,
      ),
    )
  })
}
