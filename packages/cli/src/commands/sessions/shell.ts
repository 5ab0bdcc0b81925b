import type { CommandInfo } from '@cairn/protocol'
// A static import: this module is loaded for `sessions shell` alone, and the bundle (build.mjs)
// leaves ws to node_modules, where a dynamic import() would not be reached from its vm.Script.
import WebSocket from 'ws'
import type { Register } from '../../command.js'
import { CliError } from '../../errors.js'
import { shortId } from '../../format/ids.js'
import { resolveSession } from '../../session-arg.js'
import { exitStatusOf } from './exec.js'

/** bash where the image has it, sh otherwise, as a login shell. */
const DEFAULT_SHELL = [
  '/bin/sh',
  '-c',
  'if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi',
]

export const register: Register = (parent, ctx) => {
  parent
    .command('shell')
    .description(
      "Open a terminal in a session's sandbox beside its agent (a pty over WebSocket); exits with the shell's status",
    )
    .argument('<id>', 'session ID or a unique prefix of it')
    .argument('[command...]', 'what to run on the terminal instead of a login shell (after --)')
    .action(async (id: string, argv: string[]) => {
      const session = await resolveSession(ctx, id)
      const { stdin, stdout } = process
      const size = () => ({ rows: stdout.rows || 24, cols: stdout.columns || 80 })
      const started = await session.commands.start(argv.length > 0 ? argv : DEFAULT_SHELL, { tty: size() })
      const api = await ctx.api()
      const url = `${api.apiUrl.replace(/^http/, 'ws').replace(/\/$/, '')}/v1/sessions/${session.id}/commands/${started.id}/terminal`
      const ws = new WebSocket(url, { headers: api.apiKey ? { authorization: `Bearer ${api.apiKey}` } : {} })
      if (stdin.isTTY)
        ctx.out.progress(`Terminal in ${shortId(session.id)} (${started.id}); exit the shell to leave`)
      const ended = await new Promise<CommandInfo>((resolve, reject) => {
        const resize = () => ws.send(JSON.stringify({ type: 'resize', ...size() }))
        const keys = (chunk: Buffer) => ws.send(chunk, { binary: true })
        const end = () => ws.send(JSON.stringify({ type: 'close' }))
        const restore = () => {
          stdout.off('resize', resize)
          stdin.off('data', keys)
          stdin.off('end', end)
          if (stdin.isTTY) stdin.setRawMode(false)
          stdin.pause()
        }
        ws.once('open', () => {
          if (stdin.isTTY) stdin.setRawMode(true)
          stdin.on('data', keys)
          stdin.once('end', end)
          stdout.on('resize', resize)
          stdin.resume()
        })
        ws.on('message', (data: Buffer, binary: boolean) => {
          if (binary) stdout.write(data)
          else {
            const message = JSON.parse(data.toString()) as {
              type: string
              command?: CommandInfo
              error?: { message?: string }
            }
            if (message.type === 'error')
              ctx.out.note(`cairn: ${message.error?.message ?? 'the terminal refused input'}`)
            if (message.type === 'exit' && message.command) {
              restore()
              resolve(message.command)
            }
          }
        })
        // A socket closed without the command's end (the server stopped, the link dropped): said, not waited on.
        ws.once('close', (code: number, reason: Buffer) => {
          restore()
          reject(
            new CliError(
              `the terminal closed before the command ended (${code}${reason.length > 0 ? ` ${reason}` : ''})`,
            ),
          )
        })
        ws.once('unexpected-response', (_request, response) => {
          restore()
          reject(new CliError(`the terminal could not be opened (HTTP ${response.statusCode})`))
        })
        ws.once('error', (error) => {
          restore()
          reject(error)
        })
      })
      ws.close()
      const status = exitStatusOf(ended)
      if (status !== 0) throw new CliError('', { exitCode: status })
    })
}
