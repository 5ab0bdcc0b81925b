import { readFile, stat } from 'node:fs/promises'
import { jsonOption, type Register } from '../../command.js'
import { UsageError } from '../../errors.js'
import { shortId } from '../../format/ids.js'
import { formatBytes } from '../../format/time.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('import')
      .description(
        "Replace a session's workspace with a tar.gz (e.g. one `sessions export` wrote); a snapshot taken first lets you undo it",
      )
      .argument('<id>', 'session ID or a unique prefix of it')
      .argument('<archive>', 'the tar.gz to import')
      .option('--merge', 'unpack over the current files instead of replacing them'),
  ).action(async (id: string, archive: string, options: { merge?: boolean }) => {
    const info = await stat(archive).catch((error: NodeJS.ErrnoException) => {
      if (error.code === 'ENOENT') throw new UsageError(`No such file: ${archive}`)
      throw error
    })
    if (!info.isFile()) throw new UsageError(`Not a file: ${archive}`, 'Give a .tar.gz file.')
    const session = await resolveSession(ctx, id)
    const spinner = ctx.out.spinner(`Importing ${archive} into ${session.id}…`)
    let result: Awaited<ReturnType<typeof session.files.import>>
    try {
      result = await session.files.import(await readFile(archive), { merge: options.merge === true })
    } finally {
      spinner.stop()
    }
    if (ctx.json) return ctx.out.data(result)
    ctx.out.line(
      `${options.merge ? 'Merged' : 'Imported'} ${result.fileCount} entries (${formatBytes(result.sizeBytes)}) into ${shortId(session.id)}`,
    )
    ctx.out.note(`Undo with: cairn sessions restore ${shortId(session.id)} ${result.snapshot.id}`)
  })
}
