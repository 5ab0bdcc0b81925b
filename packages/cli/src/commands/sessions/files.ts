import { jsonOption, type Register } from '../../command.js'
import { oneLine } from '../../format/sanitize.js'
import { renderTable } from '../../format/table.js'
import { formatBytes, relativeTime } from '../../format/time.js'
import { resolveSession, resolveSnapshot } from '../../session-arg.js'
import { register as get } from './files-get.js'
import { register as put } from './files-put.js'

export const register: Register = (parent, ctx) => {
  const files = jsonOption(
    parent
      .command('files')
      .alias('ls-files')
      .description(
        "List a directory of a session's workspace (`files put` and `files get` upload and download a file)",
      )
      .argument('<id>', 'session ID or a unique prefix of it')
      .argument('[path]', 'directory inside /workspace', '')
      .option('--snapshot <snapshot>', 'list it as it is in this snapshot'),
  ).action(async (id: string, dir: string, options: { snapshot?: string }) => {
    const session = await resolveSession(ctx, id)
    const snapshot =
      options.snapshot === undefined ? undefined : await resolveSnapshot(session, options.snapshot)
    const entries = await session.files.list(dir, { snapshot })
    if (ctx.json) return ctx.out.data(entries)
    if (entries.length === 0) {
      ctx.out.note('Empty.')
      return
    }
    const now = new Date()
    const rows = entries.map((e) => [
      e.type === 'directory' ? 'dir' : e.type,
      e.type === 'directory' ? '-' : formatBytes(e.size),
      relativeTime(e.modifiedAt, now),
      oneLine(e.type === 'directory' ? `${e.name}/` : e.target ? `${e.name} -> ${e.target}` : e.name),
    ])
    ctx.out.line(renderTable(['Type', 'Size', 'Modified', 'Name'], rows, ctx.out.c.bold))
  })
  for (const r of [put, get]) r(files, ctx)
}
