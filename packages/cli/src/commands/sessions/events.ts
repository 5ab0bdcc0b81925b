import { jsonOption, type Register } from '../../command.js'
import { oneLine } from '../../format/sanitize.js'
import { renderTable } from '../../format/table.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('events')
      .description("List a session's status changes with their causes, oldest first")
      .argument('<id>', 'session ID or a unique prefix of it'),
  ).action(async (id: string) => {
    const session = await resolveSession(ctx, id)
    const events = await session.events()
    if (ctx.json) return ctx.out.data(events)
    if (events.length === 0) {
      ctx.out.note('No events yet.')
      return
    }
    const rows = events.map((e) => [
      oneLine(e.at),
      `${e.from === null ? '∅' : oneLine(e.from)} → ${oneLine(e.to)}`,
      oneLine(e.cause),
      oneLine(e.detail ?? '', 80),
    ])
    ctx.out.line(renderTable(['At', 'From → To', 'Cause', 'Detail'], rows, ctx.out.c.bold))
  })
}
