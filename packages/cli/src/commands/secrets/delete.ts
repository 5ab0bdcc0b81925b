import { jsonOption, type Register } from '../../command.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('delete')
      .alias('rm')
      .description('Delete a secret of an agent')
      .argument('<agent>', 'agent name or ID')
      .argument('<name>', 'secret name'),
  ).action(async (agent: string, name: string) => {
    await (await ctx.client()).secrets.delete(agent, name)
    if (ctx.json) return ctx.out.data({ ok: true, name })
    ctx.out.line(`Deleted ${name} from ${agent}`)
  })
}
