import { Command } from 'commander'
import type { Register } from './command.js'
import { CLI_VERSION, type Context } from './context.js'

/** Loads a command; `rest` is the words after its name when it alone is run (see sessions/index.ts). */
type Loader = (rest?: readonly string[]) => Promise<{ register: Register }>

/**
 * The top-level commands (and their aliases), each loaded only when it is the one being run, so that
 * `cairn --version` loads no API client and only `cairn server` loads the server.
 */
const COMMANDS: ReadonlyArray<readonly [names: readonly string[], load: Loader]> = [
  [['server'], () => import('./commands/server.js')],
  [['node'], () => import('./commands/node.js')],
  [['migrate'], () => import('./commands/migrate.js')],
  [['doctor'], () => import('./commands/doctor.js')],
  [['cluster'], () => import('./commands/cluster/index.js')],
  [['login'], () => import('./commands/login.js')],
  [['logout'], () => import('./commands/logout.js')],
  [['init'], () => import('./commands/init.js')],
  [['deploy'], () => import('./commands/deploy.js')],
  [['run'], () => import('./commands/run.js')],
  [['agents', 'agent'], () => import('./commands/agents/index.js')],
  [['sessions', 'session'], (rest) => import('./commands/sessions/index.js').then((m) => m.load(rest))],
  [['secrets', 'secret'], () => import('./commands/secrets/index.js')],
  [['keys', 'key'], () => import('./commands/keys/index.js')],
  [['webhooks', 'webhook'], () => import('./commands/webhooks/index.js')],
  [['images', 'image'], () => import('./commands/images/index.js')],
  [['nodes'], () => import('./commands/nodes/index.js')],
  [['mcp'], () => import('./commands/mcp.js')],
  [['completion'], () => import('./commands/completion.js')],
]

/** The commands `args` needs: the one it names; all of them for help, a typo or no command at all. */
function loadersFor(args: readonly string[] | undefined): Array<() => ReturnType<Loader>> {
  const all = COMMANDS.map(
    ([, load]) =>
      () =>
        load(),
  )
  if (args === undefined) return all
  const first = args.find((a) => !a.startsWith('-'))
  if (first === undefined) {
    // `cairn --version` needs no command; `cairn` alone and `cairn --help` list them all.
    return args.length > 0 && args.every((a) => a === '-v' || a === '--version') ? [] : all
  }
  const named = COMMANDS.find(([names]) => names.includes(first))
  // `completion` describes the whole tree.
  if (!named || first === 'completion') return all
  const rest = args.slice(args.indexOf(first) + 1)
  return [() => named[1](rest)]
}

/**
 * The command tree. Global flags are taken out of argv before it parses (see argv.ts). With `args`,
 * only the command they name is loaded (a CLI that answers at once); without, every command.
 */
export async function buildProgram(ctx: Context, args?: readonly string[]): Promise<Command> {
  const program = new Command('cairn')
    .description('Cairn: deploy AI agents and talk to them in persistent, isolated sessions')
    .version(CLI_VERSION, '-v, --version', 'print the version')
    .option('--json', 'print machine-readable JSON on stdout (accepted anywhere on the line)')
    .option('--color', 'colours in a pipe too (also FORCE_COLOR=1)')
    .option('--no-color', 'no colours (also NO_COLOR=1)')
    .option('--api-url <url>', 'the server (env CAIRN_API_URL; default http://127.0.0.1:7070)')
    .option('--api-key <key>', 'API key (env CAIRN_API_KEY; default: the one saved by `cairn login`)')
    .helpOption('-h, --help', 'show help')
    .showSuggestionAfterError(true)
    .exitOverride()
    .configureOutput({
      writeOut: (s) => ctx.out.write(s),
      writeErr: (s) => process.stderr.write(s),
      outputError: (s, write) => write(ctx.out.ec.red(s.replace(/^error: /, '✗ '))),
    })
    .addHelpText(
      'after',
      `
Exit codes: 0 ok, 1 error, 2 usage, 130 cancelled.

Getting started:
  cairn server                  start a server on this machine (writes the CLI's credentials)
  cairn init && cairn deploy    package and deploy the project in this directory
  cairn run my-agent "hello"    talk to it in a new session
  cairn sessions list           see sessions; resume one with \`cairn sessions resume <id-prefix>\``,
    )
  const modules = await Promise.all(loadersFor(args).map((load) => load()))
  for (const { register } of modules) register(program, ctx)
  return program
}
