import { jsonOption, type Register } from '../../command.js'
import { oneLine } from '../../format/sanitize.js'
import { renderTable } from '../../format/table.js'
import { relativeTime } from '../../format/time.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('list', { isDefault: true })
      .alias('ls')
      .description(
        "List the tenant's API keys, revoked ones too (their prefixes only; keys are never shown again)",
      ),
  ).action(async () => {
    const keys = await (await ctx.client()).keys.list()
    if (ctx.json) return ctx.out.data(keys)
    if (keys.length === 0) {
      ctx.out.note('No API keys. Create one with `cairn keys create`.')
      return
    }
    const now = new Date()
    const when = (at: string | null) => (at === null ? '-' : relativeTime(at, now))
    const rows = keys.map((k) => [
      k.id,
      `${oneLine(k.prefix, 24)}…`,
      oneLine(k.role),
      oneLine(k.name ?? '-', 40),
      when(k.createdAt),
      when(k.lastUsedAt),
      when(k.revokedAt),
    ])
    ctx.out.line(
      renderTable(['ID', 'Prefix', 'Role', 'Name', 'Created', 'Last used', 'Revoked'], rows, ctx.out.c.bold),
    )
  })
}
