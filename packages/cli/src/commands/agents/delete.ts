import { jsonOption, type Register } from '../../command.js'
import { oneLine } from '../../format/sanitize.js'
import { confirmDestructive } from '../../prompt.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('delete')
      .alias('rm')
      .description('Delete an agent')
      .argument('<agent>', 'agent name or ID')
      .option('-y, --yes', 'do not ask for confirmation (needed without a terminal)'),
  ).action(async (idOrName: string, options: { yes?: boolean }) => {
    const client = await ctx.client()
    const agent = await client.agents.get(idOrName)
    await confirmDestructive(`Delete agent ${oneLine(agent.name)}?`, {
      yes: options.yes,
      refused: 'Nothing deleted',
      command: `cairn agents delete ${idOrName}`,
    })
    await client.agents.delete(agent.id)
    if (ctx.json) return ctx.out.data({ ok: true, id: agent.id, name: agent.name })
    ctx.out.line(`Deleted agent ${oneLine(agent.name)} (${agent.id})`)
  })
}
