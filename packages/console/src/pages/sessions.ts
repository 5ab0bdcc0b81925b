import { SESSION_STATUSES, type SessionInfo, type SessionStatus } from '@cairn/protocol'
import { fill, h, timeAgo } from '../dom.js'
import { button, emptyRow, label, type Page, type PageContext, poll, statusBadge } from '../ui.js'

const PAGE_SIZE = 20
/** A title search walks every page (the API filters by agent and status only); this many at most. */
const SEARCH_LIMIT = 2000

/** Filters survive leaving the page and coming back. */
const filters = { agent: '', status: '', search: '' }

/** Presets the sessions page to one agent's sessions. */
export function filterSessionsBy(agent: string): void {
  Object.assign(filters, { agent, status: '', search: '' })
}

export function sessionTitle(s: SessionInfo): string {
  return s.title || s.id
}

export function sessionsPage(ctx: PageContext): Page {
  const { client, signal } = ctx
  const cursors: (string | undefined)[] = [undefined]
  let pageIndex = 0
  let nextCursor: string | undefined
  let lastJson = ''

  const agentSelect = h('select', { id: 'filter-agent' }, h('option', { value: '' }, 'All agents'))
  const statusSelect = h(
    'select',
    { id: 'filter-status' },
    h('option', { value: '' }, 'Any status'),
    SESSION_STATUSES.filter((s) => s !== 'deleted').map((s) => h('option', { value: s }, s)),
  )
  const search = h('input', { id: 'filter-search', type: 'search', placeholder: 'Title or ID' })
  agentSelect.value = filters.agent
  statusSelect.value = filters.status
  search.value = filters.search
  const tbody = h('tbody')
  const summary = h('p', { class: 'muted', 'aria-live': 'polite' })
  const prev = button('← Newer', { id: 'page-prev' })
  const next = button('Older →', { id: 'page-next' })

  const row = (s: SessionInfo) =>
    h(
      'tr',
      { 'data-session': s.id },
      h(
        'td',
        { 'data-label': 'Session' },
        h('a', { href: `#/sessions/${s.id}` }, sessionTitle(s)),
        s.title ? h('div', { class: 'muted mono small' }, s.id) : null,
      ),
      h('td', { 'data-label': 'Agent' }, h('a', { href: `#/agents/${s.agentName}` }, s.agentName)),
      h(
        'td',
        { 'data-label': 'Status' },
        statusBadge(s.status, true),
        h('span', { class: 'muted small' }, ` ${s.statusCause}`),
      ),
      h('td', { 'data-label': 'Turns', class: 'num' }, String(s.turnCount)),
      h('td', { 'data-label': 'Last active' }, timeAgo(s.lastActiveAt)),
      h('td', { 'data-label': 'Created' }, timeAgo(s.createdAt)),
    )

  const show = (data: SessionInfo[], text: string) => {
    const json = JSON.stringify(data) + text
    if (json === lastJson) return
    lastJson = json
    fill(tbody, data.length ? data.map(row) : emptyRow(6, 'No sessions match.'))
    summary.textContent = text
  }

  const query = () => ({
    agent: agentSelect.value || undefined,
    status: (statusSelect.value || undefined) as SessionStatus | undefined,
  })

  /** Answers to older requests (a poll racing a filter change) are dropped. */
  let generation = 0
  const load = async () => {
    const mine = ++generation
    const term = search.value.trim().toLowerCase()
    if (term) {
      const matches: SessionInfo[] = []
      let seen = 0
      for await (const s of client.sessions.listAll({ ...query(), limit: 200, signal })) {
        if (++seen > SEARCH_LIMIT) break
        if ((s.title ?? '').toLowerCase().includes(term) || s.id.includes(term)) matches.push(s)
      }
      if (mine !== generation) return
      prev.disabled = true
      next.disabled = true
      show(matches, `${matches.length} session(s) whose title or ID contains “${search.value.trim()}”.`)
      return
    }
    const page = await client.sessions.list({
      ...query(),
      limit: PAGE_SIZE,
      cursor: cursors[pageIndex],
      signal,
    })
    if (mine !== generation) return
    nextCursor = page.nextCursor
    prev.disabled = pageIndex === 0
    next.disabled = nextCursor === undefined
    const first = pageIndex * PAGE_SIZE + 1
    show(
      page.data,
      page.data.length
        ? `Sessions ${first}–${first + page.data.length - 1}, newest first. Statuses refresh every few seconds.`
        : '',
    )
  }

  const reload = () => {
    filters.agent = agentSelect.value
    filters.status = statusSelect.value
    filters.search = search.value
    cursors.splice(1)
    pageIndex = 0
    load().catch(ctx.report)
  }
  agentSelect.addEventListener('change', reload)
  statusSelect.addEventListener('change', reload)
  let typing: ReturnType<typeof setTimeout> | undefined
  search.addEventListener('input', () => {
    clearTimeout(typing)
    typing = setTimeout(reload, 300)
  })
  prev.addEventListener('click', () => {
    if (pageIndex === 0) return
    pageIndex--
    load().catch(ctx.report)
  })
  next.addEventListener('click', () => {
    if (nextCursor === undefined) return
    cursors[pageIndex + 1] = nextCursor
    pageIndex++
    load().catch(ctx.report)
  })

  fill(
    ctx.main,
    h('h1', null, 'Sessions'),
    h(
      'div',
      { class: 'filters', role: 'search' },
      label('Agent', agentSelect),
      label('Status', statusSelect),
      label('Search', search),
    ),
    summary,
    h(
      'table',
      { class: 'list', id: 'sessions-table' },
      h(
        'thead',
        null,
        h(
          'tr',
          null,
          ['Session', 'Agent', 'Status', 'Turns', 'Last active', 'Created'].map((t) =>
            h('th', { scope: 'col' }, t),
          ),
        ),
      ),
      tbody,
    ),
    h('div', { class: 'row pager' }, prev, next),
  )

  client.agents
    .list({ signal })
    .then((agents) => {
      for (const a of agents) agentSelect.append(h('option', { value: a.name }, a.name))
      agentSelect.value = filters.agent
    })
    .catch(ctx.report)
  load().catch(ctx.report)
  poll(3000, signal, load)
  return {}
}
