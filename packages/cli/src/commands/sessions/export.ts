import { createWriteStream } from 'node:fs'
import { stat } from 'node:fs/promises'
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import type { ReadableStream as WebStream } from 'node:stream/web'
import { jsonOption, type Register } from '../../command.js'
import { UsageError } from '../../errors.js'
import { formatBytes } from '../../format/time.js'
import { resolveSession, resolveSnapshot } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('export')
      .description("Download a session's workspace (or a snapshot of it) as tar.gz")
      .argument('<id>', 'session ID or a unique prefix of it')
      .option('-o, --output <file>', 'where to write it ("-" for stdout; default <session id>.tar.gz)')
      .option('--snapshot <snapshot>', 'export this snapshot instead of the live workspace'),
  ).action(async (id: string, options: { output?: string; snapshot?: string }) => {
    if (options.output === '-' && ctx.json) throw new UsageError('--json and -o - both want stdout')
    const session = await resolveSession(ctx, id)
    const snapshot =
      options.snapshot === undefined ? undefined : await resolveSnapshot(session, options.snapshot)
    const body = Readable.fromWeb((await session.files.export({ snapshot })) as WebStream<Uint8Array>)
    if (options.output === '-') {
      await pipeline(body, ctx.out.stdout, { end: false })
      return
    }
    const file = options.output ?? `${session.id}.tar.gz`
    const spinner = ctx.out.spinner(`Exporting ${session.id}…`)
    try {
      await pipeline(body, createWriteStream(file))
    } finally {
      spinner.stop()
    }
    const bytes = (await stat(file)).size
    if (ctx.json) return ctx.out.data({ path: file, bytes })
    ctx.out.line(`Wrote ${file} (${formatBytes(bytes)})`)
  })
}
