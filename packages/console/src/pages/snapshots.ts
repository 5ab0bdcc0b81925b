import type { SnapshotInfo } from '@cairn/sdk'
import { fill, h, timeAgo } from '../dom.js'
import { act, button, confirmDialog, label, type PageContext } from '../ui.js'
import type { Panel, SessionState } from './session-state.js'

/** When a snapshot was taken, by its reason (SNAPSHOT_REASONS); the turn it follows is its title. */
const REASONS: Record<string, (s: SnapshotInfo) => string> = {
  before_turn: (s) => `what turn ${s.throughTurn + 1} starts from`,
  after_setup: () => 'after the setup phase',
  at_end: () => 'when the session ended',
  manual: () => 'taken by hand',
  before_restore: () => 'the files before a restore',
  before_import: () => 'the files before an import',
  before_merge: () => 'the files before a merge',
  review: () => 'the files the agent asked a review of',
}

/** "Before the first turn", "After turn 2", or "After turns 2–4" when turns 3 and 4 changed nothing. */
const when = (s: SnapshotInfo) => {
  if (s.throughTurn === 0) return 'Before the first turn'
  if (s.throughTurn > s.turn) return `After turns ${s.turn}–${s.throughTurn}`
  return `After turn ${s.turn}`
}
const reasonOf = (s: SnapshotInfo) => REASONS[s.reason]?.(s) ?? s.reason.replace(/_/g, ' ')

const describe = (s: SnapshotInfo) =>
  `the snapshot ${s.throughTurn === 0 ? 'from before the first turn' : `after turn ${s.turn}`}${s.label ? ` (“${s.label}”)` : ''}`

/** The snapshot timeline: take one, restore one, undo the last turn, fork a new session from one. */
export function snapshotsPanel(ctx: PageContext, state: SessionState): Panel {
  const snapshots = ctx.client.sessions.snapshots(state.id)
  const labelInput = h('input', {
    id: 'snapshot-label',
    type: 'text',
    maxlength: 200,
    placeholder: 'optional',
  })
  const take = button('Take snapshot', { id: 'snapshot-take', class: 'primary' })
  const undo = button('Undo last turn', { id: 'snapshot-undo' })
  const timeline = h('ol', { class: 'timeline', id: 'snapshot-list' })

  const load = async () => {
    const list = await snapshots.list({ signal: ctx.signal })
    fill(
      timeline,
      list.length
        ? [...list].reverse().map(item)
        : h('li', { class: 'muted' }, 'No snapshots yet. One is taken before every turn.'),
    )
  }

  const item = (s: SnapshotInfo) => {
    const restore = button('Restore', { 'data-action': 'restore' })
    const fork = button('Fork', { 'data-action': 'fork' })
    const browse = button('Browse files', { 'data-action': 'browse', class: 'link' })
    restore.addEventListener('click', async () => {
      const ok = await confirmDialog(
        `Replace the workspace with ${describe(s)}? The current files are kept in a “before_restore” snapshot.`,
        'Restore',
      )
      if (!ok) return
      await act(ctx, restore, async () => {
        await snapshots.restore({ snapshotId: s.id })
        await Promise.all([state.refresh(), load()])
        ctx.notify(`Workspace restored from ${describe(s)}.`)
      })
    })
    fork.addEventListener('click', () =>
      act(ctx, fork, async () => {
        const base = state.info?.title || state.id
        const created = await snapshots.fork({
          snapshotId: s.id,
          title: `${base} (fork at turn ${s.turn})`.slice(0, 200),
        })
        ctx.navigate(`#/sessions/${created.id}`, `Forked into a new session from ${describe(s)}.`)
      }),
    )
    browse.addEventListener('click', () => state.browse(s.id))
    return h(
      'li',
      { 'data-snapshot': s.id },
      h(
        'div',
        { class: 'row wrap spread' },
        h(
          'div',
          null,
          h('strong', null, when(s)),
          ' ',
          h('span', { class: `badge kind-${s.kind}` }, s.kind),
          ' ',
          h('span', { class: 'muted reason' }, reasonOf(s)),
          s.label ? h('span', { class: 'label' }, ` — ${s.label}`) : null,
          h('div', { class: 'muted small' }, h('span', { class: 'mono' }, s.id), ' · ', timeAgo(s.createdAt)),
        ),
        h('div', { class: 'row' }, browse, restore, fork),
      ),
    )
  }

  take.addEventListener('click', () =>
    act(ctx, take, async () => {
      const created = await snapshots.create({ label: labelInput.value.trim() || undefined })
      labelInput.value = ''
      await load()
      ctx.notify(`Snapshot ${created.id} taken.`)
    }),
  )
  undo.addEventListener('click', async () => {
    const ok = await confirmDialog(
      'Undo the last turn? The workspace goes back to how it was before that turn.',
      'Undo',
    )
    if (!ok) return
    await act(ctx, undo, async () => {
      const result = await snapshots.undo()
      await Promise.all([state.refresh(), load()])
      ctx.notify(`Workspace restored from ${describe(result.snapshot)}.`)
    })
  })

  const el = h(
    'section',
    { class: 'panel', 'aria-label': 'Snapshots' },
    h('div', { class: 'row wrap toolbar' }, label('Label', labelInput), take, undo),
    timeline,
  )
  return { el, show: () => void load().catch(ctx.report) }
}
