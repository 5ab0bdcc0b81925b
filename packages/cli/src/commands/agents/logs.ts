import type { RevisionInfo } from '@cairn/protocol'
import { jsonOption, type Register } from '../../command.js'
import { CliError } from '../../errors.js'
import { stripTerminalEscapes } from '../../format/sanitize.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('logs')
      .description("Print a revision's build log")
      .argument('<agent>', 'agent name or ID')
      .argument('[revision]', 'revision ID (default: the latest)')
      .option('-f, --follow', 'keep printing while it builds'),
  ).action(async (idOrName: string, revisionArg: string | undefined, options: { follow?: boolean }) => {
    const client = await ctx.client()
    const agent = await client.agents.get(idOrName)
    const latest = [...agent.revisions].sort((a: RevisionInfo, b: RevisionInfo) =>
      b.createdAt.localeCompare(a.createdAt),
    )[0]
    const revisionId = revisionArg ?? latest?.id
    if (revisionId === undefined) throw new CliError(`Agent ${agent.name} has no revisions`)
    if (options.follow && !ctx.json) {
      for await (const event of client.agents.followLogs(agent.id, revisionId)) {
        if (event.type === 'log') ctx.out.line(stripTerminalEscapes(event.line))
        else ctx.out.progress(`${revisionId}: ${event.status}${event.error ? ` (${event.error})` : ''}`)
      }
      return
    }
    const log = await client.agents.logs(agent.id, revisionId)
    if (ctx.json) return ctx.out.data({ revisionId, ...log, error: log.error ?? null })
    for (const line of log.lines) ctx.out.line(stripTerminalEscapes(line))
    ctx.out.progress(
      `${revisionId}: ${log.status}${log.error ? ` (${stripTerminalEscapes(log.error)})` : ''}`,
    )
  })
}
