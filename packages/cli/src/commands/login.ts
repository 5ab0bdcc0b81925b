import { AuthenticationError, Cairn, DEFAULT_BASE_URL } from '@cairn/sdk'
import { jsonOption, type Register } from '../command.js'
import { credentialsPath, readCredentials, writeCredentials } from '../credentials.js'
import { CliError, UsageError } from '../errors.js'
import { askLine, canPrompt, readStdin } from '../prompt.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('login')
      .description('Check an API key against the server and save it for the CLI')
      .option('--api-key <key>', 'the key (otherwise asked for, or read from stdin)')
      .option(
        '--api-url <url>',
        'the server (default: CAIRN_API_URL, the saved one, or http://127.0.0.1:7070)',
      ),
  ).action(async () => {
    const file = credentialsPath(ctx.env)
    // An unreadable credentials file is overwritten by this login: its saved URL is only a default.
    const saved = await readCredentials(file).catch(() => undefined)
    const apiUrl = (ctx.flags.apiUrl ?? ctx.env.CAIRN_API_URL ?? saved?.apiUrl ?? DEFAULT_BASE_URL).replace(
      /\/+$/,
      '',
    )
    let apiKey = ctx.flags.apiKey
    if (apiKey === undefined) {
      if (canPrompt()) {
        const answer = await askLine(`API key for ${apiUrl}: `, [], true)
        apiKey = answer.kind === 'line' ? answer.text : undefined
      } else if (process.stdin.isTTY !== true) {
        apiKey = (await readStdin()).split(/\r?\n/)[0]
      }
    }
    apiKey = apiKey?.trim()
    if (!apiKey)
      throw new UsageError(
        'No API key given',
        'Pass --api-key <key>, or pipe it: `cat admin.key | cairn login`.',
      )
    const spinner = ctx.out.spinner(`Checking the key with ${apiUrl}…`)
    try {
      await new Cairn({ baseUrl: apiUrl, apiKey }).agents.list()
    } catch (error) {
      if (error instanceof AuthenticationError) {
        throw new CliError(`${apiUrl} refused that API key`, {
          hint: 'Copy the key again (the server wrote it to <data-dir>/admin.key).',
        })
      }
      throw error
    } finally {
      spinner.stop()
    }
    await writeCredentials({ apiUrl, apiKey }, file)
    if (ctx.json) return ctx.out.data({ apiUrl, credentialsPath: file })
    ctx.out.line(`Logged in to ${apiUrl}`)
    ctx.out.progress(`Credentials saved to ${file}`)
  })
}
