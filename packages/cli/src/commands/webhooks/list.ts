import { jsonOption, type Register } from '../../command.js'
import { oneLine } from '../../format/sanitize.js'
import { renderTable } from '../../format/table.js'
import { relativeTime } from '../../format/time.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('list', { isDefault: true })
      .alias('ls')
      .description("List the tenant's webhook endpoints"),
  ).action(async () => {
    const hooks = await (await ctx.client()).webhooks.list()
    if (ctx.json) return ctx.out.data(hooks)
    if (hooks.length === 0) {
      ctx.out.note('No webhooks. Register one with `cairn webhooks create <url> --events all`.')
      return
    }
    const now = new Date()
    const rows = hooks.map((h) => [
      h.id,
      oneLine(h.url, 60),
      oneLine(h.events.join(','), 60),
      h.enabled ? 'yes' : 'no',
      relativeTime(h.createdAt, now),
    ])
    ctx.out.line(renderTable(['ID', 'URL', 'Events', 'Enabled', 'Created'], rows, ctx.out.c.bold))
  })
}
