import { editDistance } from '@cairn/protocol/core'
import type { Command } from 'commander'
import { UsageError } from './errors.js'

/**
 * The commands `word` is nearest to, by their names (an alias counts for its command): those at the
 * least distance, when it is small for the word's length (one edit in three characters, at least one).
 */
export function nearestCommands(word: string, commands: readonly Command[]): string[] {
  const limit = Math.max(1, Math.floor(word.length / 3))
  let best = limit + 1
  let names: string[] = []
  for (const command of commands) {
    const distance = Math.min(...[command.name(), ...command.aliases()].map((n) => editDistance(word, n)))
    if (distance < best) {
      best = distance
      names = [command.name()]
    } else if (distance === best && !names.includes(command.name())) names.push(command.name())
  }
  return names
}

/**
 * Refuses `cairn <group> <word>` when the group has subcommands and `word` names none of them: a
 * group with a default subcommand (`sessions`, `agents`, `keys`, `nodes`) would otherwise hand the
 * word to it as an argument (`cairn sessions lst` listed the sessions of an agent called `lst`).
 */
export function refuseUnknownSubcommand(program: Command, args: readonly string[]): void {
  const at = args.findIndex((a) => !a.startsWith('-'))
  const first = args[at]
  const group = program.commands.find((c) => c.name() === first || c.aliases().includes(first ?? ''))
  const word = args[at + 1]
  if (!group || group.commands.length === 0 || word === undefined || word.startsWith('-') || word === 'help')
    return
  if (group.commands.some((c) => c.name() === word || c.aliases().includes(word))) return
  const near = nearestCommands(word, group.commands)
  const suggestion = near.map((name) => `\`cairn ${group.name()} ${name}\``).join(' or ')
  throw new UsageError(
    `unknown command '${group.name()} ${word}'`,
    near.length > 0
      ? `Did you mean ${suggestion}?`
      : `See \`cairn ${group.name()} --help\` for its commands.`,
  )
}
