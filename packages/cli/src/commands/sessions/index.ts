import type { Register } from '../../command.js'
import { register as cat } from './cat.js'
import { register as del } from './delete.js'
import { register as diff } from './diff.js'
import { register as end } from './end.js'
import { register as events } from './events.js'
import { register as exp } from './export.js'
import { register as files } from './files.js'
import { register as fork } from './fork.js'
import { register as get } from './get.js'
import { register as imp } from './import.js'
import { register as lease } from './lease.js'
import { register as list } from './list.js'
import { register as messages } from './messages.js'
import { register as open } from './open.js'
import { register as restore } from './restore.js'
import { register as resume } from './resume.js'
import { register as revokeUrls } from './revoke-urls.js'
import { register as snapshot } from './snapshot.js'
import { register as snapshots } from './snapshots.js'
import { register as undo } from './undo.js'
import { register as watch } from './watch.js'

export const register: Register = (parent, ctx) => {
  const sessions = parent
    .command('sessions')
    .alias('session')
    .description('List, inspect, resume, end and delete sessions')
  for (const r of [
    list,
    get,
    resume,
    end,
    del,
    messages,
    events,
    watch,
    lease,
    open,
    revokeUrls,
    snapshot,
    snapshots,
    restore,
    undo,
    fork,
    files,
    cat,
    diff,
    exp,
    imp,
  ])
    r(sessions, ctx)
}
