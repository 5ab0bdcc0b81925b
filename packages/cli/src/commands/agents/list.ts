import { jsonOption, type Register } from '../../command.js'
import { shortId } from '../../format/ids.js'
import { oneLine } from '../../format/sanitize.js'
import { renderTable } from '../../format/table.js'
import { relativeTime } from '../../format/time.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent.command('list', { isDefault: true }).alias('ls').description('List deployed agents'),
  ).action(async () => {
    const agents = await (await ctx.client()).agents.list()
    if (ctx.json) return ctx.out.data(agents)
    if (agents.length === 0) {
      ctx.out.note('No agents yet. Deploy one with `cairn deploy`.')
      return
    }
    const now = new Date()
    const rows = agents.map((a) => [
      oneLine(a.name, 32),
      shortId(a.id),
      oneLine(a.command.join(' '), 40),
      a.protocol,
      a.currentRevisionId ? shortId(a.currentRevisionId) : '-',
      relativeTime(a.updatedAt, now),
    ])
    ctx.out.line(
      renderTable(['Name', 'ID', 'Command', 'Protocol', 'Revision', 'Updated'], rows, ctx.out.c.bold),
    )
  })
}
