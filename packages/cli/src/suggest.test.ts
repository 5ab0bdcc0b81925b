import { editDistance } from '@cairn/protocol/core'
import { Command } from 'commander'
import { describe, expect, it } from 'vitest'
import { UsageError } from './errors.js'
import { nearestCommands, refuseUnknownSubcommand } from './suggest.js'

function program(): Command {
  const root = new Command('cairn')
  const sessions = root.command('sessions').alias('session')
  sessions.command('list', { isDefault: true }).alias('ls').argument('[agent]')
  sessions.command('delete').alias('rm')
  sessions.command('snapshot')
  sessions.command('snapshots')
  root.command('run').argument('<agent>')
  return root
}

describe('editDistance', () => {
  it('counts inserts, deletes, substitutions and swapped neighbours', () => {
    expect(editDistance('list', 'list')).toBe(0)
    expect(editDistance('lst', 'list')).toBe(1)
    expect(editDistance('lsit', 'list')).toBe(1)
    expect(editDistance('delte', 'delete')).toBe(1)
    expect(editDistance('', 'ls')).toBe(2)
    expect(editDistance('my-agent', 'list')).toBeGreaterThan(4)
  })
})

describe('nearestCommands', () => {
  const sessions = () => program().commands[0]?.commands ?? []
  it('names the nearest commands (an alias counts for its command), only when near', () => {
    expect(nearestCommands('lst', sessions())).toEqual(['list'])
    expect(nearestCommands('snapshop', sessions())).toEqual(['snapshot'])
    expect(nearestCommands('snapshotz', sessions())).toEqual(['snapshot', 'snapshots'])
    expect(nearestCommands('rn', sessions())).toEqual(['delete'])
    expect(nearestCommands('my-agent', sessions())).toEqual([])
  })
})

describe('refuseUnknownSubcommand', () => {
  it('refuses a word after a group that names none of its commands, as a usage error', () => {
    const error = (() => {
      try {
        refuseUnknownSubcommand(program(), ['sessions', 'lst'])
      } catch (e) {
        return e
      }
    })()
    expect(error).toBeInstanceOf(UsageError)
    expect(error).toMatchObject({ message: "unknown command 'sessions lst'", exitCode: 2, code: 'usage' })
    expect((error as UsageError).hint).toBe('Did you mean `cairn sessions list`?')
    expect(() => refuseUnknownSubcommand(program(), ['session', 'nothing-like-it'])).toThrow(
      /unknown command 'sessions nothing-like-it'/,
    )
  })

  it('lets commands, aliases, flags, help and commands without subcommands through', () => {
    for (const args of [
      ['sessions'],
      ['sessions', 'ls', 'my-agent'],
      ['sessions', 'rm', 'ses_1'],
      ['sessions', '--status', 'idle'],
      ['sessions', 'help'],
      ['run', 'my-agent'],
      ['--help'],
      [],
    ])
      expect(() => refuseUnknownSubcommand(program(), args), args.join(' ')).not.toThrow()
  })
})
