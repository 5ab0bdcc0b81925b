import { jsonOption, type Register } from '../../command.js'
import { renderTranscript } from '../../format/session.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('messages')
      .alias('history')
      .description("Print a session's transcript")
      .argument('<id>', 'session ID or a unique prefix of it'),
  ).action(async (id: string) => {
    const session = await resolveSession(ctx, id)
    const messages = await session.messages()
    if (ctx.json) return ctx.out.data(messages)
    if (messages.length === 0) {
      ctx.out.note('No messages yet.')
      return
    }
    const { c } = ctx.out
    ctx.out.line(
      renderTranscript(messages, (role) =>
        role === 'user' ? c.bold(c.green('You>')) : c.bold(c.cyan('Agent>')),
      ),
    )
  })
}
