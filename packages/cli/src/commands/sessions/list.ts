import { SESSION_STATUSES, type SessionInfo, type SessionStatus } from '@cairn/protocol'
import { InvalidArgumentError } from 'commander'
import { jsonOption, positiveInt, type Register } from '../../command.js'
import { SESSION_HEAD, sessionRow } from '../../format/session.js'
import { renderTable } from '../../format/table.js'

function status(value: string): SessionStatus {
  if (!(SESSION_STATUSES as readonly string[]).includes(value)) {
    throw new InvalidArgumentError(`expected one of ${SESSION_STATUSES.join(', ')}`)
  }
  return value as SessionStatus
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('list', { isDefault: true })
      .alias('ls')
      .description('List sessions, most recent first')
      .option('--agent <agent>', 'only sessions of this agent (name or ID)')
      .option('--status <status>', `only sessions with this status (${SESSION_STATUSES.join(', ')})`, status)
      .option('--limit <n>', 'show at most n sessions', positiveInt, 50),
  ).action(async (options: { agent?: string; status?: SessionStatus; limit: number }) => {
    const client = await ctx.client()
    const sessions: SessionInfo[] = []
    for await (const s of client.sessions.listAll({
      agent: options.agent,
      status: options.status,
      limit: Math.min(options.limit, 500),
    })) {
      sessions.push(s)
      if (sessions.length >= options.limit) break
    }
    if (ctx.json) return ctx.out.data(sessions)
    if (sessions.length === 0) {
      ctx.out.note('No sessions yet. Start one with `cairn run <agent>`.')
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
