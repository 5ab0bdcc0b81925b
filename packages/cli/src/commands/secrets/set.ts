import type { SecretScope } from '@cairn/sdk'
import { InvalidArgumentError } from 'commander'
import { jsonOption, type Register } from '../../command.js'
import { UsageError } from '../../errors.js'
import { askLine, canPrompt, readStdin } from '../../prompt.js'

const SCOPES = ['setup', 'runtime', 'proxy'] as const
const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/

function scope(value: string): SecretScope {
  if (!(SCOPES as readonly string[]).includes(value))
    throw new InvalidArgumentError(`expected ${SCOPES.join(', ')}`)
  return value as SecretScope
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('set')
      .description(
        'Set secrets of an agent (NAME=value; a bare NAME asks for the value, or reads it from stdin)',
      )
      .argument('<agent>', 'agent name or ID')
      .argument('<secrets...>', 'NAME=value pairs')
      .option('--scope <scope>', `where the secret is visible: ${SCOPES.join(', ')}`, scope)
      .option(
        '--host <host>',
        'with --scope proxy: a host the value is sent to (repeatable; api.example.com, *.example.com, host:8443)',
        (value: string, previous: string[] = []) => [...previous, value],
      )
      .option(
        '--header <name>',
        'with --scope proxy: a request header the value is swapped into besides Authorization, X-Api-Key and the other credential headers (repeatable)',
        (value: string, previous: string[] = []) => [...previous, value],
      ),
  ).action(
    async (
      agent: string,
      pairs: string[],
      options: { scope?: SecretScope; host?: string[]; header?: string[] },
    ) => {
      const secrets: Record<string, string> = {}
      for (const pair of pairs) {
        const eq = pair.indexOf('=')
        const name = eq < 0 ? pair : pair.slice(0, eq)
        if (!NAME.test(name))
          throw new UsageError(`Invalid secret name '${name}'`, 'Use letters, digits and _ (not first).')
        if (eq >= 0) {
          secrets[name] = pair.slice(eq + 1)
        } else if (canPrompt()) {
          const answer = await askLine(`Value of ${name}: `, [], true)
          if (answer.kind !== 'line') throw new UsageError(`No value for ${name}`)
          secrets[name] = answer.text
        } else if (pairs.length === 1 && process.stdin.isTTY !== true) {
          secrets[name] = (await readStdin()).replace(/\r?\n$/, '')
        } else {
          throw new UsageError(`No value for ${name}`, 'Write NAME=value, or pipe a single value on stdin.')
        }
      }
      const client = await ctx.client()
      const result = await client.secrets.set(agent, secrets, {
        scope: options.scope,
        hosts: options.host,
        headers: options.header,
      })
      if (ctx.json) return ctx.out.data(result)
      ctx.out.line(`Set ${Object.keys(secrets).join(', ')} for ${agent}`)
      if (result.missing.length > 0)
        ctx.out.note(ctx.out.ec.yellow(`Still missing: ${result.missing.join(', ')}`))
    },
  )
}
