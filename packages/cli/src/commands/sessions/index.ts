import type { Register } from '../../command.js'

type Loader = () => Promise<{ register: Register }>

/**
 * The `sessions` subcommands (names and aliases), in help order. Each is loaded only when it is the
 * one run: `cairn sessions list` registers one command with commander, not 22, and loads none of
 * the others' modules (streams, readline, archives).
 */
const SUBCOMMANDS: ReadonlyArray<readonly [names: readonly string[], load: Loader]> = [
  [['list', 'ls'], () => import('./list.js')],
  [['get'], () => import('./get.js')],
  [['resume'], () => import('./resume.js')],
  [['end'], () => import('./end.js')],
  [['delete', 'rm'], () => import('./delete.js')],
  [['messages', 'history'], () => import('./messages.js')],
  [['events'], () => import('./events.js')],
  [['watch'], () => import('./watch.js')],
  [['lease'], () => import('./lease.js')],
  [['open'], () => import('./open.js')],
  [['revoke-urls'], () => import('./revoke-urls.js')],
  [['snapshot'], () => import('./snapshot.js')],
  [['snapshots'], () => import('./snapshots.js')],
  [['restore'], () => import('./restore.js')],
  [['undo'], () => import('./undo.js')],
  [['fork'], () => import('./fork.js')],
  [['merge'], () => import('./merge.js')],
  [['files', 'ls-files'], () => import('./files.js')],
  [['cat'], () => import('./cat.js')],
  [['diff'], () => import('./diff.js')],
  [['export'], () => import('./export.js')],
  [['import'], () => import('./import.js')],
  [['move'], () => import('./move.js')],
  [['exec'], () => import('./exec.js')],
  [['shell'], () => import('./shell.js')],
  [['approvals'], () => import('./approvals.js')],
  [['approve'], () => import('./approve.js')],
  [['deny'], () => import('./deny.js')],
]

/**
 * The `sessions` command with the subcommands `rest` (the words after `sessions`) needs: the one its
 * first word names; all of them otherwise (no rest: every one, for help and completion; a flag, a
 * typo or nothing: commander's default, help and suggestions see the whole set).
 */
export async function load(rest?: readonly string[]): Promise<{ register: Register }> {
  const named =
    rest?.[0] === undefined ? undefined : SUBCOMMANDS.find(([names]) => names.includes(rest[0] ?? ''))
  const loaders = named ? [named[1]] : SUBCOMMANDS.map(([, loader]) => loader)
  const modules = await Promise.all(loaders.map((loader) => loader()))
  return {
    register: (parent, ctx) => {
      const sessions = parent
        .command('sessions')
        .alias('session')
        .description('List, inspect, resume, end and delete sessions')
      for (const { register } of modules) register(sessions, ctx)
    },
  }
}
