import { jsonOption, type Register } from '../../command.js'
import { oneLine } from '../../format/sanitize.js'
import { renderTable } from '../../format/table.js'
import { relativeTime } from '../../format/time.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('list')
      .alias('ls')
      .description(
        "List an agent's secrets (names only; values are never shown) and the required ones still missing",
      )
      .argument('<agent>', 'agent name or ID'),
  ).action(async (agent: string) => {
    const result = await (await ctx.client()).secrets.list(agent)
    if (ctx.json) return ctx.out.data(result)
    const now = new Date()
    const rows = result.data.map((s) => [
      oneLine(s.name, 64),
      s.hosts ? oneLine(`${s.scope} → ${s.hosts.join(', ')}`, 80) : s.scope,
      relativeTime(s.updatedAt, now),
    ])
    for (const name of result.missing) rows.push([oneLine(name, 64), '-', ctx.out.c.yellow('missing')])
    if (rows.length === 0) {
      ctx.out.note(`No secrets. Set one with \`cairn secrets set ${agent} NAME=value\`.`)
      return
    }
    ctx.out.line(renderTable(['Name', 'Scope', 'Updated'], rows, ctx.out.c.bold))
  })
}
