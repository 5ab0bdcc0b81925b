import { createWriteStream } from 'node:fs'
import { stat } from 'node:fs/promises'
import path from 'node:path'
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import type { ReadableStream as WebStream } from 'node:stream/web'
import type { Command } from 'commander'
import { jsonOption, type Register } from '../../command.js'
import { UsageError } from '../../errors.js'
import { formatBytes } from '../../format/time.js'
import { resolveSession, resolveSnapshot } from '../../session-arg.js'

const isDirectory = (file: string) =>
  stat(file).then(
    (s) => s.isDirectory(),
    () => false,
  )

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('get')
      .description("Download a file of a session's workspace")
      .argument('<id>', 'session ID or a unique prefix of it')
      .argument('<path>', 'file inside /workspace')
      .argument(
        '[local]',
        "where to write it: a file, a directory, or - for stdout (default: the file's name, in the current directory)",
      )
      .option('--snapshot <snapshot>', 'read it from this snapshot'),
  ).action(async (id: string, remote: string, local: string | undefined, _: unknown, command: Command) => {
    // `files` has a --snapshot option of its own, which takes it wherever it is on the line.
    const options = command.optsWithGlobals<{ snapshot?: string }>()
    if (local === '-' && ctx.json) throw new UsageError('--json and - both want stdout')
    const name = path.posix.basename(remote)
    if (name === '') throw new UsageError(`'${remote}' is not a file`, 'Name a file inside /workspace.')
    let file = local ?? name
    if (local !== '-' && (await isDirectory(file))) file = path.join(file, name)
    const session = await resolveSession(ctx, id)
    const snapshot =
      options.snapshot === undefined ? undefined : await resolveSnapshot(session, options.snapshot)
    // A missing file fails here, before anything local is created or truncated.
    const body = Readable.fromWeb((await session.files.stream(remote, { snapshot })) as WebStream<Uint8Array>)
    if (local === '-') {
      await pipeline(body, ctx.out.stdout, { end: false })
      return
    }
    await pipeline(body, createWriteStream(file))
    const bytes = (await stat(file)).size
    if (ctx.json) return ctx.out.data({ path: remote, local: file, bytes })
    ctx.out.line(`Wrote ${file} (${formatBytes(bytes)})`)
  })
}
