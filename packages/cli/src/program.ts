import { Command } from 'commander'
import { register as agents } from './commands/agents/index.js'
import { register as completion } from './commands/completion.js'
import { register as deploy } from './commands/deploy.js'
import { register as init } from './commands/init.js'
import { register as keys } from './commands/keys/index.js'
import { register as login } from './commands/login.js'
import { register as logout } from './commands/logout.js'
import { register as run } from './commands/run.js'
import { register as secrets } from './commands/secrets/index.js'
import { register as server } from './commands/server.js'
import { register as sessions } from './commands/sessions/index.js'
import { CLI_VERSION, type Context } from './context.js'

/** The command tree. Global flags are taken out of argv before it parses (see argv.ts). */
export function buildProgram(ctx: Context): Command {
  const program = new Command('cairn')
    .description('Cairn: deploy AI agents and talk to them in persistent, isolated sessions')
    .version(CLI_VERSION, '-v, --version', 'print the version')
    .option('--json', 'print machine-readable JSON on stdout (accepted anywhere on the line)')
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
  for (const register of [
    server,
    login,
    logout,
    init,
    deploy,
    run,
    agents,
    sessions,
    secrets,
    keys,
    completion,
  ]) {
    register(program, ctx)
  }
  return program
}
