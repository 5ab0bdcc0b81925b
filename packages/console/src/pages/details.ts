import { fill, h, timeAgo } from '../dom.js'
import { emptyRow, type PageContext, statusBadge } from '../ui.js'
import type { Panel, SessionState } from './session-state.js'

/** Every status change of the session with its cause: the answer to "why did my session stop?". */
export function eventsPanel(ctx: PageContext, state: SessionState): Panel {
  const tbody = h('tbody')
  const el = h(
    'section',
    { class: 'panel', 'aria-label': 'Events' },
    h(
      'table',
      { class: 'list', id: 'event-log' },
      h(
        'thead',
        null,
        h(
          'tr',
          null,
          ['When', 'From', 'To', 'Cause', 'Detail'].map((t) => h('th', { scope: 'col' }, t)),
        ),
      ),
      tbody,
    ),
  )
  const load = async () => {
    const events = await ctx.client.sessions.events(state.id, { signal: ctx.signal })
    fill(
      tbody,
      events.length
        ? [...events]
            .reverse()
            .map((e) =>
              h(
                'tr',
                null,
                h('td', { 'data-label': 'When' }, timeAgo(e.at)),
                h('td', { 'data-label': 'From' }, e.from ? statusBadge(e.from) : '–'),
                h('td', { 'data-label': 'To' }, statusBadge(e.to)),
                h('td', { 'data-label': 'Cause', class: 'mono' }, e.cause),
                h('td', { 'data-label': 'Detail' }, e.detail ?? ''),
              ),
            )
        : emptyRow(5, 'No events.'),
    )
  }
  return {
    el,
    show: () => void load().catch(ctx.report),
    // A background refresh: a failure keeps the shown details, and the next poll tries again.
    onInfo: () => void (!el.hidden && load().catch(() => undefined)),
  }
}
