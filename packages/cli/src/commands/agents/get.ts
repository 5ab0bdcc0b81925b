import { jsonOption, type Register } from '../../command.js'
import { shortId } from '../../format/ids.js'
import { oneLine } from '../../format/sanitize.js'
import { renderFields, renderTable } from '../../format/table.js'
import { formatBytes, relativeTime } from '../../format/time.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('get')
      .description('Show an agent and its revisions')
      .argument('<agent>', 'agent name or ID'),
  ).action(async (idOrName: string) => {
    const agent = await (await ctx.client()).agents.get(idOrName)
    if (ctx.json) return ctx.out.data(agent)
    const now = new Date()
    const { c } = ctx.out
    ctx.out.line(
      renderFields(
        [
          ['Name', oneLine(agent.name)],
          ['ID', agent.id],
          ['Command', oneLine(agent.command.join(' '))],
          ['Protocol', agent.protocol],
          ['Revision', agent.currentRevisionId ?? '-'],
          ['Created', `${agent.createdAt} (${relativeTime(agent.createdAt, now)})`],
          ['Updated', `${agent.updatedAt} (${relativeTime(agent.updatedAt, now)})`],
        ],
        c.bold,
      ),
    )
    if (agent.revisions.length === 0) return
    ctx.out.line()
    const rows = agent.revisions.map((r) => [
      shortId(r.id),
      r.status,
      String(r.fileCount),
      formatBytes(r.sizeBytes),
      relativeTime(r.createdAt, now),
      r.error ? oneLine(r.error, 60) : '',
    ])
    ctx.out.line(renderTable(['Revision', 'Status', 'Files', 'Size', 'Created', 'Error'], rows, c.bold))
  })
}
