import { existsSync } from 'node:fs'
import { writeFile } from 'node:fs/promises'
import path from 'node:path'
import { jsonOption, type Register } from '../command.js'
import { CliError, UsageError } from '../errors.js'

interface InitOptions {
  name?: string
  entry?: string
  force?: boolean
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('init')
      .description('Write a commented cairn.yaml for the project in the current directory')
      .argument('[dir]', 'project directory', '.')
      .option('--name <name>', "the agent's name (default: the directory's name)")
      .option(
        '--entry <file>',
        'the file that starts the agent (default: agent.py, main.py, index.js … when present)',
      )
      .option('--force', 'overwrite an existing cairn.yaml'),
  ).action(async (dirArg: string, options: InitOptions) => {
    const { agentNameFrom, findEntry, inferCommand, isValidAgentName, MANIFEST_FILES, renderManifest } =
      await import('../pack/manifest.js')
    const dir = path.resolve(dirArg)
    if (!existsSync(dir)) throw new UsageError(`No such directory: ${dirArg}`)
    const existing = MANIFEST_FILES.map((f) => path.join(dir, f)).find((f) => existsSync(f))
    if (existing && !options.force) {
      throw new CliError(`${existing} already exists`, { hint: 'Pass --force to overwrite it.' })
    }
    const name = options.name ?? agentNameFrom(path.basename(dir))
    if (!isValidAgentName(name)) {
      throw new UsageError(
        `Invalid agent name '${name}'`,
        "Use lower-case letters, digits and '-' (up to 63).",
      )
    }
    const entry = options.entry ?? (await findEntry(dir))
    const inferred = entry === undefined ? undefined : inferCommand(entry)
    if (options.entry !== undefined && inferred === undefined) {
      throw new UsageError(
        `Cannot tell how to run ${options.entry}`,
        'Use a .py, .ts, .js, .mjs or .sh file, or edit the command afterwards.',
      )
    }
    const command = inferred ?? ['python3', 'agent.py']
    const file = existing ?? path.join(dir, 'cairn.yaml')
    await writeFile(file, renderManifest({ name, command, protocol: 'stdio' }, true))
    if (ctx.json) return ctx.out.data({ path: file, name, command, protocol: 'stdio' })
    ctx.out.line(
      `Wrote ${path.relative(process.cwd(), file) || file} (name: ${name}, command: ${command.join(' ')})`,
    )
    if (inferred === undefined)
      ctx.out.note(ctx.out.ec.yellow('No entry file found: edit `command:` before deploying.'))
    ctx.out.progress('Deploy it with: cairn deploy')
  })
}
