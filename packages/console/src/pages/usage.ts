import { SESSION_STATUSES, type SessionInfo } from '@cairn/protocol'
import { fill, h, timeAgo } from '../dom.js'
import { act, button, type Page, type PageContext, section, statusBadge } from '../ui.js'
import { sessionTitle } from './sessions.js'

/** Sessions whose snapshots are counted one by one (one request each); past this the count is partial. */
const SNAPSHOT_SCAN_LIMIT = 300

/**
 * Usage from the list endpoints (the API has no usage endpoint yet): sessions by status and agent,
 * turns, and snapshots per session. Storage bytes and retention's bytes freed are not exposed by the API.
 */
export function usagePage(ctx: PageContext): Page {
  const { client } = ctx
  const summary = h('div', { class: 'stats', id: 'usage-stats' })
  const byStatus = h('tbody')
  const byAgent = h('tbody')
  const perSession = h('tbody')
  const note = h('p', { class: 'muted small' })
  const recount = button('Recount', { id: 'usage-recount' })

  const stat = (name: string, value: string | number) =>
    h(
      'div',
      { class: 'stat' },
      h('div', { class: 'stat-value' }, String(value)),
      h('div', { class: 'stat-name' }, name),
    )

  const count = async () => {
    const sessions: SessionInfo[] = []
    for await (const s of client.sessions.listAll({ limit: 200, signal: ctx.signal })) sessions.push(s)
    const statuses = new Map<string, number>(
      SESSION_STATUSES.filter((s) => s !== 'deleted').map((s) => [s, 0]),
    )
    const agents = new Map<string, { sessions: number; turns: number }>()
    let turns = 0
    for (const s of sessions) {
      statuses.set(s.status, (statuses.get(s.status) ?? 0) + 1)
      const a = agents.get(s.agentName) ?? { sessions: 0, turns: 0 }
      a.sessions++
      a.turns += s.turnCount
      agents.set(s.agentName, a)
      turns += s.turnCount
    }
    const scanned = sessions.slice(0, SNAPSHOT_SCAN_LIMIT)
    const snapshotCounts = new Map<string, number>()
    let next = 0
    const worker = async () => {
      while (next < scanned.length) {
        const s = scanned[next++] as SessionInfo
        const list = await client.sessions
          .snapshots(s.id)
          .list({ signal: ctx.signal })
          .catch(() => [])
        snapshotCounts.set(s.id, list.length)
      }
    }
    await Promise.all([worker(), worker(), worker(), worker()])
    const snapshots = [...snapshotCounts.values()].reduce((a, b) => a + b, 0)

    fill(
      summary,
      stat('sessions', sessions.length),
      stat('active now', statuses.get('active') ?? 0),
      stat('turns', turns),
      stat(
        sessions.length > scanned.length ? `snapshots (first ${scanned.length} sessions)` : 'snapshots',
        snapshots,
      ),
      stat('agents', agents.size),
    )
    fill(
      byStatus,
      [...statuses].map(([status, n]) =>
        h(
          'tr',
          null,
          h('td', { 'data-label': 'Status' }, statusBadge(status)),
          h('td', { 'data-label': 'Sessions', class: 'num' }, String(n)),
        ),
      ),
    )
    fill(
      byAgent,
      [...agents].map(([name, a]) =>
        h(
          'tr',
          null,
          h('td', { 'data-label': 'Agent' }, h('a', { href: `#/agents/${name}` }, name)),
          h('td', { 'data-label': 'Sessions', class: 'num' }, String(a.sessions)),
          h('td', { 'data-label': 'Turns', class: 'num' }, String(a.turns)),
        ),
      ),
    )
    fill(
      perSession,
      scanned.map((s) =>
        h(
          'tr',
          null,
          h('td', { 'data-label': 'Session' }, h('a', { href: `#/sessions/${s.id}` }, sessionTitle(s))),
          h('td', { 'data-label': 'Status' }, statusBadge(s.status)),
          h('td', { 'data-label': 'Turns', class: 'num' }, String(s.turnCount)),
          h('td', { 'data-label': 'Snapshots', class: 'num' }, String(snapshotCounts.get(s.id) ?? '–')),
          h('td', { 'data-label': 'Last active' }, timeAgo(s.lastActiveAt)),
        ),
      ),
    )
    note.textContent = `Counted ${new Date().toLocaleTimeString()} from the session list. Storage per session and bytes freed by retention are not reported by the API yet.`
  }

  const table = (id: string, heads: string[], body: HTMLElement) =>
    h(
      'table',
      { class: 'list', id },
      h(
        'thead',
        null,
        h(
          'tr',
          null,
          heads.map((t) => h('th', { scope: 'col' }, t)),
        ),
      ),
      body,
    )

  recount.addEventListener('click', () => act(ctx, recount, count))
  fill(
    ctx.main,
    h('div', { class: 'row spread wrap' }, h('h1', null, 'Usage'), recount),
    summary,
    note,
    h(
      'div',
      { class: 'grid2' },
      section('Sessions by status', table('usage-status', ['Status', 'Sessions'], byStatus)),
      section('By agent', table('usage-agents', ['Agent', 'Sessions', 'Turns'], byAgent)),
    ),
    section(
      'Per session',
      table('usage-sessions', ['Session', 'Status', 'Turns', 'Snapshots', 'Last active'], perSession),
    ),
  )
  void act(ctx, recount, count)
  return {}
}
