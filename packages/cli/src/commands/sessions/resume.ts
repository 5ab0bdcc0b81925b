import { chat, exitFromChat } from '../../chat.js'
import { jsonOption, type Register } from '../../command.js'
import { oneLine } from '../../format/sanitize.js'
import { type PolicyFlags, policyFromFlags, policyOptions } from '../../policy-options.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    policyOptions(
      parent
        .command('resume')
        .description(
          'Resume a session (on a fresh sandbox if needed, same workspace and transcript) and continue it; policy flags change its lifecycle policy',
        )
        .argument('<id>', 'session ID or a unique prefix of it'),
    ),
  ).action(async (id: string, options: PolicyFlags) => {
    const session = await resolveSession(ctx, id)
    await session.resume({ policy: policyFromFlags(options) })
    if (ctx.json) return ctx.out.data(session.info)
    ctx.out.line(`Resumed: "${oneLine(session.title ?? 'untitled', 80)}" (${oneLine(session.agentName)})`)
    exitFromChat(await chat(ctx, session))
  })
}
