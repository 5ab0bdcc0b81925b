import type { SessionInfo } from '@cairn/protocol'
import { fill, formatMs, h, timeAgo } from '../dom.js'
import { act, button, confirmDialog, type Page, type PageContext, poll, statusBadge } from '../ui.js'
import { approvalBox } from './approval.js'
import { eventsPanel } from './details.js'
import { filesPanel } from './files.js'
import { forkDialog } from './fork-dialog.js'
import { manifestPanel } from './manifest.js'
import type { Panel, SessionState } from './session-state.js'
import { sessionTitle } from './sessions.js'
import { snapshotsPanel } from './snapshots.js'
import { terminalPanel } from './terminal.js'
import { transcriptPanel } from './transcript.js'

export type { Panel, SessionState } from './session-state.js'

const TABS = [
  ['transcript', 'Transcript'],
  ['files', 'Files'],
  ['snapshots', 'Snapshots'],
  ['events', 'Events'],
  ['manifest', 'Manifest'],
  ['terminal', 'Terminal'],
] as const
type Tab = (typeof TABS)[number][0]
const RESUMABLE = new Set(['completed', 'failed', 'timeout'])

export function sessionPage(ctx: PageContext, id: string, initialTab?: string): Page {
  const { client } = ctx
  const title = h('h1', { id: 'session-title' }, id)
  const meta = h('dl', { class: 'meta' })
  const actions = h('div', { class: 'row wrap', role: 'group', 'aria-label': 'Session actions' })
  const tabs = h('nav', { class: 'tabs', 'aria-label': 'Session' })
  const body = h('div', { class: 'tab-body' })
  const panels = new Map<Tab, Panel>()
  let selected: Tab | undefined
  let files: ReturnType<typeof filesPanel> | undefined
  let review: ReturnType<typeof approvalBox> | undefined

  const state: SessionState = {
    id,
    info: undefined,
    refresh: async () => {
      const info = await client.sessions.info(id, { signal: ctx.signal })
      const changed = JSON.stringify(info) !== JSON.stringify(state.info)
      state.info = info
      if (!changed) return
      renderHeader(info)
      review?.onInfo(info)
      for (const panel of panels.values()) panel.onInfo?.(info)
    },
    browse: (snapshotId) => {
      files ??= filesPanel(ctx, state)
      files.source(snapshotId)
      if (selected === 'files') files.show()
      else ctx.navigate(`#/sessions/${id}/files`)
    },
  }

  const create = (tab: Tab): Panel => {
    if (tab === 'transcript') return transcriptPanel(ctx, state)
    if (tab === 'files') {
      files ??= filesPanel(ctx, state)
      return files
    }
    if (tab === 'snapshots') return snapshotsPanel(ctx, state)
    if (tab === 'events') return eventsPanel(ctx, state)
    if (tab === 'terminal') return terminalPanel(ctx, state)
    return manifestPanel(ctx, state)
  }

  const select = (name: string | undefined) => {
    const tab = (TABS.find(([t]) => t === name)?.[0] ?? 'transcript') as Tab
    let panel = panels.get(tab)
    if (!panel) {
      panel = create(tab)
      panels.set(tab, panel)
      body.append(panel.el)
    }
    if (selected && selected !== tab) panels.get(selected)?.hide?.()
    for (const [t, p] of panels) p.el.hidden = t !== tab
    for (const a of tabs.querySelectorAll('a')) {
      if (a.dataset.tab === tab) a.setAttribute('aria-current', 'page')
      else a.removeAttribute('aria-current')
    }
    selected = tab
    panel.show()
  }

  const end = button('End', { id: 'session-end' })
  const resume = button('Resume', { id: 'session-resume' })
  const fork = button('Fork', { id: 'session-fork' })
  const remove = button('Delete', { id: 'session-delete', class: 'danger' })
  fork.addEventListener('click', () => act(ctx, fork, () => forkDialog(ctx, state)))
  end.addEventListener('click', async () => {
    const ok = await confirmDialog(
      'End this session? Its sandbox stops; the workspace and transcript are kept and it can be resumed.',
      'End session',
    )
    if (ok)
      await act(ctx, end, async () => {
        await client.sessions.end(id)
        await state.refresh()
        ctx.notify('Session ended.')
      })
  })
  resume.addEventListener('click', () =>
    act(ctx, resume, async () => {
      await client.sessions.resume(id)
      await state.refresh()
      ctx.notify('Session resumed.')
    }),
  )
  remove.addEventListener('click', async () => {
    const ok = await confirmDialog(
      'Delete this session, its workspace and its snapshots? This cannot be undone.',
      'Delete session',
    )
    if (ok)
      await act(ctx, remove, async () => {
        await client.sessions.delete(id)
        ctx.navigate('#/sessions', `Session ${id} deleted.`)
      })
  })

  const renderHeader = (info: SessionInfo) => {
    title.textContent = sessionTitle(info)
    const item = (term: string, ...value: (Node | string)[]) =>
      h('div', null, h('dt', null, term), h('dd', null, ...value))
    fill(
      meta,
      item('Status', statusBadge(info.status, true), h('span', { class: 'muted' }, ` ${info.statusCause}`)),
      item('Agent', h('a', { href: `#/agents/${info.agentName}` }, info.agentName)),
      item('ID', h('span', { class: 'mono' }, info.id)),
      item('Turns', String(info.turnCount)),
      item('Sandbox', info.warm ? 'warm' : 'stopped'),
      item('Last active', timeAgo(info.lastActiveAt)),
      item('Idle timeout', formatMs(info.idleTimeoutMs)),
      // Policy limits, shown only when a session has them.
      ...(info.policy?.maxTurns != null
        ? [item('Max turns', `${info.turnCount} of ${info.policy.maxTurns}`)]
        : []),
      ...(info.policy?.maxDurationMs != null
        ? [
            item(
              'Max duration',
              `${formatMs(info.policy.maxDurationMs)}${info.deadlineAt ? ` (until ${info.deadlineAt})` : ''}`,
            ),
          ]
        : []),
      ...(info.policy?.onTimeout === 'destroy' ? [item('On timeout', 'destroy the workspace')] : []),
    )
    end.hidden = !(info.status === 'idle' || info.status === 'active')
    resume.hidden = !RESUMABLE.has(info.status)
    remove.hidden = info.status === 'deleted'
    fork.hidden = info.status === 'deleted'
  }

  review = approvalBox(ctx, state)
  fill(actions, resume, fork, end, remove)
  for (const [tab, text] of TABS) {
    tabs.append(h('a', { href: `#/sessions/${id}/${tab}`, 'data-tab': tab }, text))
  }
  fill(
    ctx.main,
    h('p', { class: 'crumbs' }, h('a', { href: '#/sessions' }, '← Sessions')),
    h('div', { class: 'row wrap spread' }, title, actions),
    meta,
    review.el,
    tabs,
    body,
  )
  state
    .refresh()
    .then(() => {
      select(initialTab)
      poll(2500, ctx.signal, state.refresh)
    })
    .catch((error) => {
      ctx.report(error)
      title.textContent = 'Session not available'
      tabs.hidden = true
      actions.hidden = true
    })

  return {
    update: (parts) => {
      if (state.info) select(parts[2])
    },
  }
}
