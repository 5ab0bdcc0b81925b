import { spawn } from 'node:child_process'
import { InvalidArgumentError } from 'commander'
import { duration, jsonOption, type Register } from '../../command.js'
import { resolveSession } from '../../session-arg.js'

export function port(value: string): number {
  const n = Number(value)
  if (!Number.isInteger(n) || n < 1 || n > 65535) throw new InvalidArgumentError('expected a port (1-65535)')
  return n
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('open')
      .description('Print a signed URL to a service listening on a port inside the session sandbox')
      .argument('<id>', 'session ID or a unique prefix of it')
      .argument('<port>', 'the TCP port the service listens on inside the sandbox', port)
      .option(
        '--ttl <duration>',
        'how long the URL stays valid: 90s, 5m, 1h (default 1h, at most 7 days)',
        duration,
      )
      .option('--browser', 'also open the URL in the default browser'),
  ).action(async (id: string, portNumber: number, options: { ttl?: number; browser?: boolean }) => {
    const session = await resolveSession(ctx, id)
    const preview = await session.previewUrl(portNumber, { ttlMs: options.ttl })
    if (options.browser) {
      // Detached and silent: the CLI's output is the URL, whatever the opener prints.
      const opener = process.platform === 'darwin' ? 'open' : 'xdg-open'
      const child = spawn(opener, [preview.url], { stdio: 'ignore', detached: true })
      child.on('error', () => ctx.out.note(`could not run ${opener}; open the URL yourself`))
      child.unref()
    }
    if (ctx.json) return ctx.out.data(preview)
    ctx.out.line(preview.url)
    ctx.out.progress(
      `valid until ${preview.expiresAt}; anyone with this URL reaches port ${portNumber} of this session`,
    )
    // A running sandbox was checked by the server (the port listens); a cold one cannot be yet.
    if (!session.info.warm)
      ctx.out.note(
        `no sandbox runs for this session now: the URL answers 409 sandbox_not_running until a message starts one and a service listens on port ${portNumber}`,
      )
  })
}
