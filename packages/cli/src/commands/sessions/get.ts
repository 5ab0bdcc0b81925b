import { jsonOption, type Register } from '../../command.js'
import { sessionFields } from '../../format/session.js'
import { renderFields } from '../../format/table.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('get')
      .description('Show a session')
      .argument('<id>', 'session ID or a unique prefix of it'),
  ).action(async (id: string) => {
    const session = await resolveSession(ctx, id)
    if (ctx.json) return ctx.out.data(session.info)
    ctx.out.line(renderFields(sessionFields(session.info, new Date()), ctx.out.c.bold))
  })
}
