import { jsonOption, type Register } from '../../command.js'
import { shortId } from '../../format/ids.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('end')
      .description('End a session (its workspace and transcript are kept; it can be resumed)')
      .argument('<id>', 'session ID or a unique prefix of it'),
  ).action(async (id: string) => {
    const session = await resolveSession(ctx, id)
    await session.end()
    if (ctx.json) return ctx.out.data(session.info)
    ctx.out.line(`Ended session ${shortId(session.id)} (${session.status})`)
  })
}
