import { describe, expect, it } from 'vitest'
import { Context } from './context.js'
import { Output } from './output.js'
import { buildProgram } from './program.js'

function context(): Context {
  return new Context(
    { json: false, color: false, apiUrl: undefined, apiKey: undefined },
    {},
    new Output({ json: false, color: false }),
  )
}

/** The names of the `sessions` subcommands registered when the CLI is built for `args`. */
async function sessionSubcommands(args?: string[]): Promise<string[]> {
  const program = await buildProgram(context(), args)
  const sessions = program.commands.find((c) => c.name() === 'sessions')
  return sessions ? sessions.commands.map((c) => c.name()) : []
}

describe('buildProgram', () => {
  it('registers only the sessions subcommand being run, by name or alias', async () => {
    expect(await sessionSubcommands(['sessions', 'list'])).toEqual(['list'])
    expect(await sessionSubcommands(['session', 'ls', '--status', 'idle'])).toEqual(['list'])
    expect(await sessionSubcommands(['sessions', 'rm', 'ses_1'])).toEqual(['delete'])
    expect(await sessionSubcommands(['sessions', 'files', 'get', 'ses_1', 'a.txt'])).toEqual(['files'])
  })

  it('registers every sessions subcommand for help, a typo, an unknown word or none', async () => {
    const all = await sessionSubcommands()
    expect(all).toHaveLength(28)
    expect(all.slice(0, 3)).toEqual(['list', 'get', 'resume'])
    for (const name of ['move', 'merge', 'exec', 'shell', 'approvals', 'approve', 'deny'])
      expect(all).toContain(name)
    for (const args of [['sessions'], ['sessions', '--help'], ['sessions', 'lsit'], ['sessions', 'my-agent']])
      expect(await sessionSubcommands(args)).toEqual(all)
  })

  it('registers only the top-level command being run', async () => {
    const program = await buildProgram(context(), ['sessions', 'list'])
    expect(program.commands.map((c) => c.name())).toEqual(['sessions'])
  })
})
