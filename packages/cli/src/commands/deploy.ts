import type { Command } from 'commander'
import { jsonOption, type Register } from '../command.js'
import type { DeployOptions } from '../pack/deploy.js'

export const register: Register = (parent: Command, ctx) => {
  jsonOption(
    parent
      .command('deploy')
      .description('Package a project (cairn.yaml, or just an entry file) and deploy it as a new revision')
      .argument('[target]', 'project directory or entry file (default: the current directory)')
      .option('--dir <dir>', 'project directory (then [target] is the entry file inside it)')
      .option('--name <name>', "the agent's name (overrides cairn.yaml)")
      .option('-y, --yes', 'do not ask anything'),
  ).action(async (target: string | undefined, options: DeployOptions) => {
    // Loaded on use: packing pulls in tar, ignore and yaml, which other commands do not need.
    const { deploy } = await import('../pack/deploy.js')
    await deploy(ctx, target, options)
  })
}
