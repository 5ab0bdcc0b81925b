import type { AgentDetail, RevisionInfo } from '@cairn/sdk'
import { fill, formatBytes, h, timeAgo } from '../dom.js'
import {
  act,
  button,
  emptyRow,
  label,
  type Page,
  type PageContext,
  poll,
  section,
  statusBadge,
} from '../ui.js'
import { secretsSection } from './secrets.js'
import { filterSessionsBy } from './sessions.js'

export function agentsPage(ctx: PageContext): Page {
  const tbody = h('tbody')
  fill(
    ctx.main,
    h('h1', null, 'Agents'),
    h(
      'p',
      { class: 'muted' },
      'Deploy agents with ',
      h('code', null, 'cairn deploy'),
      '; open one to see its revisions, build logs and secrets.',
    ),
    h(
      'table',
      { class: 'list', id: 'agents-table' },
      h(
        'thead',
        null,
        h(
          'tr',
          null,
          ['Agent', 'Protocol', 'Command', 'Updated'].map((t) => h('th', { scope: 'col' }, t)),
        ),
      ),
      tbody,
    ),
  )
  ctx.client.agents
    .list({ signal: ctx.signal })
    .then((agents) =>
      fill(
        tbody,
        agents.length
          ? agents.map((a) =>
              h(
                'tr',
                null,
                h('td', { 'data-label': 'Agent' }, h('a', { href: `#/agents/${a.name}` }, a.name)),
                h('td', { 'data-label': 'Protocol' }, a.protocol),
                h('td', { 'data-label': 'Command', class: 'mono small' }, a.command.join(' ')),
                h('td', { 'data-label': 'Updated' }, timeAgo(a.updatedAt)),
              ),
            )
          : emptyRow(4, 'No agents yet.'),
      ),
    )
    .catch(ctx.report)
  return {}
}

export function agentPage(ctx: PageContext, name: string): Page {
  const { client } = ctx
  const title = h('h1', null, name)
  const meta = h('dl', { class: 'meta' })
  const revisions = h('tbody')
  const log = h('pre', { class: 'code log', id: 'build-log', tabindex: '0', 'aria-label': 'Build log' })
  const logTitle = h('h3', null, 'Build log')
  const logBox = h('div', { class: 'log-box', hidden: true }, logTitle, log)
  const sessionTitle = h('input', {
    id: 'new-session-title',
    type: 'text',
    maxlength: 200,
    placeholder: 'optional',
  })
  const create = button('New session', { id: 'new-session', class: 'primary' })
  let following: AbortController | undefined
  let shownLog: string | undefined
  let lastJson = ''

  const showLog = async (rev: RevisionInfo) => {
    following?.abort()
    shownLog = rev.id
    logBox.hidden = false
    logTitle.textContent = `Build log of ${rev.id} (${rev.status})`
    log.textContent = ''
    if (rev.status !== 'DEPLOYING') {
      const result = await client.agents.logs(name, rev.id, { signal: ctx.signal })
      log.textContent = result.lines.join('\n') || '(no output)'
      if (result.error) log.append(`\n\nerror: ${result.error}`)
      return
    }
    const controller = new AbortController()
    following = controller
    ctx.signal.addEventListener('abort', () => controller.abort(), { once: true })
    try {
      for await (const event of client.agents.followLogs(name, rev.id, { signal: controller.signal })) {
        if (event.type === 'log') log.append(`${event.line}\n`)
        else {
          logTitle.textContent = `Build log of ${rev.id} (${event.status})`
          if (event.error) log.append(`\nerror: ${event.error}`)
          await load()
        }
      }
    } catch (error) {
      if (!controller.signal.aborted) ctx.report(error)
    }
  }

  const revisionRow = (agent: AgentDetail, rev: RevisionInfo) => {
    const open = button('Build log', { 'data-revision': rev.id })
    open.addEventListener('click', () => act(ctx, open, () => showLog(rev)))
    return h(
      'tr',
      null,
      h(
        'td',
        { 'data-label': 'Revision', class: 'mono' },
        rev.id,
        rev.id === agent.currentRevisionId ? h('span', { class: 'badge' }, 'current') : null,
      ),
      h(
        'td',
        { 'data-label': 'Status' },
        statusBadge(rev.status),
        rev.error ? h('div', { class: 'error small' }, rev.error) : null,
      ),
      h('td', { 'data-label': 'Files' }, `${rev.fileCount} · ${formatBytes(rev.sizeBytes)}`),
      h('td', { 'data-label': 'Created' }, timeAgo(rev.createdAt)),
      h('td', { 'data-label': 'Log' }, open),
    )
  }

  const load = async () => {
    const agent = await client.agents.get(name, { signal: ctx.signal })
    const json = JSON.stringify(agent)
    if (json === lastJson) return
    lastJson = json
    title.textContent = agent.name
    const item = (term: string, value: Node | string) =>
      h('div', null, h('dt', null, term), h('dd', null, value))
    fill(
      meta,
      item('ID', h('span', { class: 'mono' }, agent.id)),
      item('Command', h('code', null, agent.command.join(' '))),
      item('Protocol', agent.protocol),
      item(
        'Sessions',
        h('a', { href: '#/sessions', onclick: () => filterSessionsBy(agent.name) }, 'show sessions'),
      ),
    )
    const revs = [...agent.revisions].sort((a, b) => b.createdAt.localeCompare(a.createdAt))
    fill(revisions, revs.length ? revs.map((r) => revisionRow(agent, r)) : emptyRow(5, 'No revisions.'))
    const building = revs.find((r) => r.status === 'DEPLOYING')
    if (building && shownLog === undefined) void showLog(building)
  }

  create.addEventListener('click', () =>
    act(ctx, create, async () => {
      const session = await client.sessions.create(name, { title: sessionTitle.value.trim() || undefined })
      ctx.navigate(`#/sessions/${session.id}`, `Session ${session.id} started.`)
    }),
  )

  fill(
    ctx.main,
    h('p', { class: 'crumbs' }, h('a', { href: '#/agents' }, '← Agents')),
    title,
    meta,
    section('New session', h('div', { class: 'row wrap toolbar' }, label('Title', sessionTitle), create)),
    section(
      'Revisions',
      h(
        'table',
        { class: 'list', id: 'revisions-table' },
        h(
          'thead',
          null,
          h(
            'tr',
            null,
            ['Revision', 'Status', 'Files', 'Created', 'Log'].map((t) => h('th', { scope: 'col' }, t)),
          ),
        ),
        revisions,
      ),
      logBox,
    ),
    secretsSection(ctx, name),
  )
  load()
    .then(() => poll(3000, ctx.signal, load))
    .catch(ctx.report)
  return {}
}
