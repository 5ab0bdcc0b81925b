import type { Command } from 'commander'
import type { Register } from '../command.js'
import { bashCompletion, type CompletionNode, zshCompletion } from '../completion-script.js'
import { UsageError } from '../errors.js'

function tree(command: Command): CompletionNode {
  const options = command.options.flatMap((o) =>
    [o.long, o.short].filter((f): f is string => f !== undefined),
  )
  return {
    name: command.name(),
    description: command.description(),
    options: [...new Set([...options, '--json', '--help'])],
    commands: command.commands.filter((c) => c.name() !== 'help').map(tree),
  }
}

export const register: Register = (parent, ctx) => {
  parent
    .command('completion')
    .description('Print a shell completion script (bash or zsh)')
    .argument('<shell>', 'bash or zsh')
    .addHelpText(
      'after',
      '\nExamples:\n  source <(cairn completion bash)\n  cairn completion zsh > ~/.zfunc/_cairn',
    )
    .action((shell: string) => {
      const root = tree(parent)
      root.options.push('--version', '--no-color', '--api-url', '--api-key')
      if (shell === 'bash') ctx.out.write(bashCompletion(root))
      else if (shell === 'zsh') ctx.out.write(zshCompletion(root))
      else
        throw new UsageError(
          `Unknown shell '${shell}'`,
          'Use `cairn completion bash` or `cairn completion zsh`.',
        )
    })
}
