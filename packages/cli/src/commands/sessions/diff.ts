import { jsonOption, type Register } from '../../command.js'
import { oneLine } from '../../format/sanitize.js'
import { resolveSession, resolveSnapshot } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('diff')
      .description('Files added (A), changed (M) and deleted (D) since the revision or a snapshot')
      .argument('<id>', 'session ID or a unique prefix of it')
      .option('--from <snapshot>', 'compare with this snapshot instead of the deployed revision'),
  ).action(async (id: string, options: { from?: string }) => {
    const session = await resolveSession(ctx, id)
    const from = options.from === undefined ? undefined : await resolveSnapshot(session, options.from)
    const diff = await session.files.diff({ from })
    if (ctx.json) return ctx.out.data(diff)
    const { c } = ctx.out
    const lines = [
      ...diff.added.map((p) => `${c.green('A')} ${oneLine(p)}`),
      ...diff.changed.map((p) => `${c.yellow('M')} ${oneLine(p)}`),
      ...diff.deleted.map((p) => `${c.red('D')} ${oneLine(p)}`),
    ]
    if (lines.length === 0) ctx.out.note(`No changes since ${diff.from}.`)
    else ctx.out.line(lines.join('\n'))
    if (diff.truncated) ctx.out.note(ctx.out.ec.yellow('The list was cut short: too many changes.'))
  })
}
