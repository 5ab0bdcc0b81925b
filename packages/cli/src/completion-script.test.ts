import { execFileSync } from 'node:child_process'
import { describe, expect, it } from 'vitest'
import { bashCompletion, type CompletionNode, zshCompletion } from './completion-script.js'

const tree: CompletionNode = {
  name: 'cairn',
  description: '',
  options: ['--json', '--help'],
  commands: [
    { name: 'deploy', description: "Package: it's a project", options: ['--dir', '--json'], commands: [] },
    {
      name: 'sessions',
      description: 'Sessions',
      options: [],
      commands: [{ name: 'get', description: 'Show', options: ['--json'], commands: [] }],
    },
  ],
}

describe('completion scripts', () => {
  it('bash: valid syntax, completes commands and subcommands', () => {
    const script = bashCompletion(tree)
    execFileSync('bash', ['-n'], { input: script })
    const complete = (line: string) =>
      execFileSync(
        'bash',
        [
          '-c',
          `${script}\nCOMP_WORDS=(${line}); COMP_CWORD=$((\${#COMP_WORDS[@]}-1)); _cairn; echo "\${COMPREPLY[*]}"`,
        ],
        {
          encoding: 'utf8',
        },
      ).trim()
    expect(complete("cairn ''")).toBe('deploy sessions --json --help')
    expect(complete('cairn se')).toBe('sessions')
    expect(complete("cairn sessions ''")).toBe('get --help')
    expect(complete('cairn deploy --d')).toBe('--dir')
  })

  it('zsh: quotes descriptions and registers the function', () => {
    const script = zshCompletion(tree)
    expect(script).toContain(`'deploy:Package: it'\\''s a project'`)
    expect(script.startsWith('#compdef cairn')).toBe(true)
  })
})
