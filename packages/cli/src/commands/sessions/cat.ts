import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { jsonOption, type Register } from '../../command.js'
import { resolveSession, resolveSnapshot } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('cat')
      .description("Print a file of a session's workspace (bytes as they are)")
      .argument('<id>', 'session ID or a unique prefix of it')
      .argument('<path>', 'file inside /workspace')
      .option('--snapshot <snapshot>', 'read it from this snapshot'),
  ).action(async (id: string, file: string, options: { snapshot?: string }) => {
    const session = await resolveSession(ctx, id)
    const snapshot =
      options.snapshot === undefined ? undefined : await resolveSnapshot(session, options.snapshot)
    if (ctx.json) {
      const text = await session.files.readText(file, { snapshot })
      return ctx.out.data({ path: file, content: text })
    }
    const body = await session.files.stream(file, { snapshot })
    await pipeline(
      Readable.fromWeb(body as import('node:stream/web').ReadableStream<Uint8Array>),
      ctx.out.stdout,
      {
        end: false,
      },
    )
  })
}
