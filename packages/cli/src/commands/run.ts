import type { Session } from '@cairn/sdk'
import { chat, exitFromChat } from '../chat.js'
import { jsonOption, type Register } from '../command.js'
import { CliError, UsageError } from '../errors.js'
import { oneLine } from '../format/sanitize.js'
import { type PolicyFlags, policyFromFlags, policyOptions } from '../policy-options.js'
import { resolveSession } from '../session-arg.js'

interface RunOptions extends PolicyFlags {
  single?: boolean
  session?: string
  title?: string
  autoSnapshots?: boolean
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    policyOptions(
      parent
        .command('run')
        .description(
          'Talk to an agent in a new session (or --session): a You>/Agent> loop on a terminal, one turn per line of piped stdin',
        )
        .argument('<agent>', 'agent name or ID')
        .argument(
          '[prompt...]',
          'first message (with --single, or when stdin is not a terminal: the only one)',
        )
        .option('--single', 'send the prompt, print the reply, exit')
        .option('--session <id>', 'continue this session (ID or unique prefix) instead of starting one')
        .option('--title <title>', 'title of the new session (default: the first message)')
        .option('--no-auto-snapshots', 'no workspace snapshot after each turn in the new session (no undo)'),
    ),
  ).action(async (agent: string, words: string[], options: RunOptions) => {
    const prompt = words.length > 0 ? words.join(' ') : undefined
    if (options.single && prompt === undefined) throw new UsageError('--single needs a prompt')
    const client = await ctx.client()
    let session: Session
    const policy = policyFromFlags(options)
    if (options.session !== undefined) {
      session = await resolveSession(ctx, options.session)
      if (policy)
        throw new UsageError('policy flags apply to a new session; use `cairn sessions resume` to change one')
      if (session.agentName !== agent && session.info.agentId !== agent) {
        throw new CliError(
          `Session ${session.id} belongs to agent ${oneLine(session.agentName)}, not ${agent}`,
          {
            hint: `Run \`cairn run ${session.agentName} --session ${options.session}\`.`,
          },
        )
      }
    } else {
      session = await client.createSession(agent, {
        title: options.title,
        // Sent only when turned off, so that servers without the field still accept the request.
        autoSnapshots: options.autoSnapshots === false ? false : undefined,
        policy,
      })
    }
    if (!ctx.json) ctx.out.note(ctx.out.ec.dim(`Session ${session.id} (${oneLine(session.agentName)})`))
    exitFromChat(await chat(ctx, session, { prompt, single: options.single === true }))
  })
}
