import { readFile, stat } from 'node:fs/promises'
import path from 'node:path'
import { CairnError } from '@cairn/sdk'
import type { Command } from 'commander'
import { jsonOption, type Register } from '../../command.js'
import { CliError, UsageError } from '../../errors.js'
import { shortId } from '../../format/ids.js'
import { formatBytes } from '../../format/time.js'
import { resolveSession } from '../../session-arg.js'

async function readStdinBytes(): Promise<Uint8Array> {
  const chunks: Buffer[] = []
  for await (const chunk of process.stdin) chunks.push(Buffer.from(chunk as Uint8Array))
  return Buffer.concat(chunks)
}

async function readLocal(file: string): Promise<Uint8Array> {
  const info = await stat(file).catch((error: NodeJS.ErrnoException) => {
    if (error.code === 'ENOENT') throw new UsageError(`No such file: ${file}`)
    throw error
  })
  if (!info.isFile()) throw new UsageError(`Not a file: ${file}`, 'Upload one file at a time.')
  return readFile(file)
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('put')
      .description(
        "Upload a local file into a session's workspace (parent directories are created; an existing file is replaced)",
      )
      .argument('<id>', 'session ID or a unique prefix of it')
      .argument('<local>', 'the file to upload, or - for stdin')
      .argument(
        '[path]',
        "where inside /workspace; ending in / means into that directory (default: the file's name, at the top)",
      ),
  ).action(async (id: string, local: string, remote: string | undefined, _: unknown, command: Command) => {
    if (command.optsWithGlobals<{ snapshot?: string }>().snapshot !== undefined)
      throw new UsageError('Snapshots are read-only', 'Put writes the live workspace; leave out --snapshot.')
    const name = local === '-' ? '' : path.basename(local)
    const target =
      remote === undefined || remote === '' ? name : remote.endsWith('/') ? `${remote}${name}` : remote
    if (target === '' || target.endsWith('/'))
      throw new UsageError(
        'Name the file in the workspace',
        'Give the path: `cairn sessions files put <id> - notes.md`.',
      )
    const bytes = local === '-' ? await readStdinBytes() : await readLocal(local)
    const session = await resolveSession(ctx, id)
    try {
      await session.files.write(target, bytes)
    } catch (error) {
      if (error instanceof CairnError && error.code === 'payload_too_large') {
        throw new CliError(error.message, {
          code: error.code,
          hint: 'The server refuses uploads over its limit (CAIRN_MAX_UPLOAD_BYTES where it runs).',
        })
      }
      throw error
    }
    if (ctx.json) return ctx.out.data({ ok: true, path: target, bytes: bytes.byteLength })
    ctx.out.line(
      `Uploaded ${local === '-' ? 'stdin' : local} to ${shortId(session.id)}:${target} (${formatBytes(bytes.byteLength)})`,
    )
  })
}
