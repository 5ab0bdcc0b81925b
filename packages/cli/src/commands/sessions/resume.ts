import { chat, exitFromChat } from '../../chat.js'
import { jsonOption, type Register } from '../../command.js'
import { oneLine } from '../../format/sanitize.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('resume')
      .description(
        'Resume a session (on a fresh sandbox if needed, same workspace and transcript) and continue it',
      )
      .argument('<id>', 'session ID or a unique prefix of it'),
  ).action(async (id: string) => {
    const session = await resolveSession(ctx, id)
    await session.resume()
    if (ctx.json) return ctx.out.data(session.info)
    ctx.out.line(`Resumed: "${oneLine(session.title ?? 'untitled', 80)}" (${oneLine(session.agentName)})`)
    exitFromChat(await chat(ctx, session))
  })
}
