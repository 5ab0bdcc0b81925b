import { SESSION_STATUSES, type SessionInfo, type Usage } from '@cairn/protocol'
import { fill, formatBytes, h, timeAgo } from '../dom.js'
import { act, button, type Page, type PageContext, section, statusBadge } from '../ui.js'
import { sessionTitle } from './sessions.js'

/** What a retention layer holds (docs/retention.md), as the page names it. */
const LAYERS: Record<string, string> = {
  snapshot: 'Snapshots',
  workspace: 'Workspaces of ended sessions',
  artifact: 'Artifacts',
  build_log: 'Build logs',
  setup_log: 'Setup logs',
  memory_version: 'Memory versions',
  network_log: 'Network log entries',
  session_event: 'Session events',
  turn_event: 'Turn stream events',
  secret: 'Expired secrets',
}

/**
 * Usage: the tenant's report (`GET /v1/usage?storage=true`: snapshots, storage against the quota,
 * what retention freed per layer, bytes per session) and counts from the session list (by status,
 * by agent, turns).
 */
export function usagePage(ctx: PageContext): Page {
  const { client } = ctx
  const summary = h('div', { class: 'stats', id: 'usage-stats' })
  const byStatus = h('tbody')
  const byAgent = h('tbody')
  const perSession = h('tbody')
  const storage = h('tbody')
  const retention = h('tbody')
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
    const usage = await client.usage({ storage: true, signal: ctx.signal })
    const bytes = new Map(usage.storage.map((s) => [s.sessionId, s]))
    fillStorage(storage, usage)
    fillRetention(retention, usage)
    fill(
      summary,
      stat('sessions', sessions.length),
      stat('active now', statuses.get('active') ?? 0),
      stat('turns', turns),
      stat('snapshots', usage.snapshots),
      stat('agents', agents.size),
      stat('stored', usage.quota.usedBytes === null ? '–' : formatBytes(usage.quota.usedBytes)),
      stat('freed by retention', formatBytes(usage.retention.bytesFreed)),
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
      sessions.map((s) =>
        h(
          'tr',
          null,
          h('td', { 'data-label': 'Session' }, h('a', { href: `#/sessions/${s.id}` }, sessionTitle(s))),
          h('td', { 'data-label': 'Status' }, statusBadge(s.status)),
          h('td', { 'data-label': 'Turns', class: 'num' }, String(s.turnCount)),
          h('td', { 'data-label': 'Exclusive', class: 'num' }, sizeOf(bytes.get(s.id)?.exclusiveBytes)),
          h('td', { 'data-label': 'Referenced', class: 'num' }, sizeOf(bytes.get(s.id)?.referencedBytes)),
          h('td', { 'data-label': 'Last active' }, timeAgo(s.lastActiveAt)),
        ),
      ),
    )
    note.textContent = `Counted ${new Date().toLocaleTimeString()}. Exclusive bytes are what deleting a session's workspace alone would free; referenced bytes include what it shares with its snapshots and forks (measured for the ${usage.storage.length} most recently active sessions).`
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
      table(
        'usage-sessions',
        ['Session', 'Status', 'Turns', 'Exclusive', 'Referenced', 'Last active'],
        perSession,
      ),
    ),
    h(
      'div',
      { class: 'grid2' },
      section('Storage', table('usage-storage', ['What', 'Count', 'Bytes'], storage)),
      section('Freed by retention', table('usage-retention', ['Layer', 'Deleted', 'Bytes freed'], retention)),
    ),
  )
  void act(ctx, recount, count)
  return {}
}

const sizeOf = (n: number | undefined) => (n === undefined ? '–' : formatBytes(n))

const row = (cells: [string, string | number][]) =>
  h(
    'tr',
    null,
    cells.map(([label, text], i) =>
      h('td', { 'data-label': label, class: i ? 'num' : undefined }, String(text)),
    ),
  )

/** What the tenant stores against its quota: workspaces and snapshots, artifacts, checkpoints, logs. */
function fillStorage(tbody: HTMLElement, usage: Usage): void {
  const { quota } = usage
  const limit = quota.tenantBytes === undefined ? '' : ` of ${formatBytes(quota.tenantBytes)}`
  const stored = quota.usedBytes === null ? 'unknown' : `${formatBytes(quota.usedBytes)}${limit}`
  const counted = (what: string, part: { count: number; bytes: number }) =>
    row([
      ['What', what],
      ['Count', part.count],
      ['Bytes', formatBytes(part.bytes)],
    ])
  fill(
    tbody,
    row([
      ['What', 'Workspaces and snapshots'],
      ['Count', usage.snapshots],
      ['Bytes', stored],
    ]),
    counted('Artifacts', usage.artifacts),
    counted('Memory checkpoints', usage.memoryCheckpoints),
    counted('Command logs', usage.commandLogs),
    row([
      ['What', 'Pool free'],
      ['Count', ''],
      ['Bytes', `${formatBytes(usage.pool.freeBytes)} of ${formatBytes(usage.pool.totalBytes)}`],
    ]),
  )
}

/** Each retention layer with what it deleted and freed, over the tenant's life (docs/retention.md). */
function fillRetention(tbody: HTMLElement, usage: Usage): void {
  // Every layer, those retention has not deleted from yet at 0.
  const layers = [...new Set([...Object.keys(LAYERS), ...Object.keys(usage.retention.layers)])].map(
    (layer) => [layer, usage.retention.layers[layer] ?? { deleted: 0, bytesFreed: 0 }] as const,
  )
  fill(
    tbody,
    layers.map(([layer, freed]) =>
      row([
        ['Layer', LAYERS[layer] ?? layer],
        ['Deleted', freed.deleted],
        ['Bytes freed', formatBytes(freed.bytesFreed)],
      ]),
    ),
    row([
      ['Layer', 'In all'],
      ['Deleted', layers.reduce((n, [, f]) => n + f.deleted, 0)],
      ['Bytes freed', formatBytes(usage.retention.bytesFreed)],
    ]),
  )
}
