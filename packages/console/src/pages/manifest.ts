import type { SessionManifest } from '@cairn/protocol'
import { type Child, fill, formatBytes, formatMs, h, timeAgo } from '../dom.js'
import { highlight } from '../highlight.js'
import { type PageContext, section, statusBadge } from '../ui.js'
import type { Panel, SessionState } from './session-state.js'

/** Fields read as a size or a duration, by the end of their name. */
const isBytes = (key: string) => /Bytes$/.test(key)
const isMs = (key: string) => /Ms$/.test(key)

/** `maxTurns` → "Max turns", `workspaceBytes` → "Workspace" (the unit goes with the value). */
const words = (key: string) => {
  const text = key
    .replace(/(Bytes|Ms)$/, '')
    .replace(/([a-z0-9])([A-Z])/g, '$1 $2')
    .replace(/_/g, ' ')
    .toLowerCase()
  return text.charAt(0).toUpperCase() + text.slice(1)
}

const none = () => h('span', { class: 'muted' }, '—')
const mono = (text: string) => h('span', { class: 'mono' }, text)

/** A value of an open object (limits, policies, setup): nested objects become nested lists. */
function value(key: string, v: unknown): Child {
  if (v === null || v === undefined || v === '') return none()
  if (typeof v === 'number' && isBytes(key)) return formatBytes(v)
  if (typeof v === 'number' && isMs(key)) return formatMs(v)
  if (typeof v === 'boolean') return v ? 'yes' : 'no'
  if (Array.isArray(v))
    return v.length ? v.map((item) => value(key, item)).flatMap((c, i) => (i ? [', ', c] : [c])) : none()
  if (typeof v === 'object') return fields(v as Record<string, unknown>)
  return String(v)
}

/** A definition list of an object's fields, in its order. */
function fields(object: Record<string, unknown>, empty?: string): HTMLElement {
  const entries = Object.entries(object)
  if (!entries.length) return empty ? h('p', { class: 'muted' }, empty) : none()
  return rows(entries.map(([key, v]) => [words(key), value(key, v)]))
}

function rows(items: [string, Child][]): HTMLElement {
  return h(
    'dl',
    { class: 'fields' },
    items.map(([term, v]) => h('div', null, h('dt', null, term), h('dd', null, v))),
  )
}

const link = (hash: string, text: string) => h('a', { href: hash }, mono(text))
const list = (items: string[], empty = 'none') =>
  items.length
    ? items.map((i) => mono(i)).flatMap((c, i) => (i ? [', ', c] : [c]))
    : h('span', { class: 'muted' }, empty)

function agentRows(m: SessionManifest): HTMLElement {
  return rows([
    ['Agent', h('a', { href: `#/agents/${m.agent.name}` }, m.agent.name)],
    ['Revision', mono(m.revision.id)],
    ['Content hash', m.revision.contentHash ? mono(m.revision.contentHash) : none()],
    ['Environment key', m.revision.envKey ? mono(m.revision.envKey) : none()],
    ['Command', mono(m.revision.command.join(' '))],
    ['Protocol', m.revision.protocol],
    ['Base image', mono(m.baseImage)],
    ['Driver', m.driver],
    ['Storage', m.storage],
    ['Setup version', m.setupVersion ? mono(m.setupVersion) : none()],
    ['Session setup', value('sessionSetup', m.sessionSetup)],
    ['Memory version', m.memoryVersion ? String(m.memoryVersion) : 'none written'],
  ])
}

function workspaceRows(m: SessionManifest, id: string): HTMLElement {
  const dirty = m.dirtyFiles
  return rows([
    ['Generation', String(m.generation)],
    ['Forked from', m.parentSessionId ? link(`#/sessions/${m.parentSessionId}`, m.parentSessionId) : none()],
    ['Fork snapshot', m.forkedFromSnapshotId ? mono(m.forkedFromSnapshotId) : none()],
    ['Snapshots', h('a', { href: `#/sessions/${id}/snapshots` }, String(m.snapshotIds.length))],
    [
      'Changed files',
      dirty
        ? `${dirty.added.length} added, ${dirty.changed.length} changed, ${dirty.deleted.length} deleted since the last snapshot${dirty.truncated ? ' (truncated)' : ''}`
        : none(),
    ],
    [
      'Git checkout',
      m.repo ? mono(`${m.repo.branch ?? '(detached)'} @ ${m.repo.sha?.slice(0, 12) ?? '?'}`) : none(),
    ],
    ['Last tests', m.lastTests ? testsText(m.lastTests) : none()],
    ['Sizes', value('workspaceSizes', m.workspaceSizes)],
    ['Persisted paths', list(m.persist.map((p) => `${p.path} → ${p.workspacePath}`))],
    ['Open ports', list(m.openPorts.map(String))],
  ])
}

/** "passed: 12 passed, 0 failed (npm test)" from the agent's `.cairn/last-tests.json`. */
function testsText(tests: NonNullable<SessionManifest['lastTests']>): string {
  const counts = (['passed', 'failed', 'skipped'] as const)
    .filter((k) => tests[k] !== undefined)
    .map((k) => `${tests[k]} ${k}`)
  return `${tests.status}${counts.length ? `: ${counts.join(', ')}` : ''}${tests.command ? ` (${tests.command})` : ''}`
}

function lastTurnRows(m: SessionManifest): HTMLElement {
  const turn = m.lastTurn
  if (!turn) return h('p', { class: 'muted' }, 'No turn yet.')
  return rows([
    ['Turn', String(turn.turn)],
    ['Status', statusBadge(turn.status)],
    ['Duration', formatMs(turn.durationMs)],
    ['Ended', turn.endedAt ? timeAgo(turn.endedAt) : none()],
    ['ID', mono(turn.id)],
  ])
}

/** The manifest as a user reads it: what runs the session, its workspace, its last turn, limits, policies. */
export function manifestPanel(ctx: PageContext, state: SessionState): Panel {
  const body = h('div', { class: 'manifest', id: 'manifest' })
  const raw = h('pre', { class: 'code', tabindex: '0', 'aria-label': 'Manifest (JSON)' })
  const el = h(
    'section',
    { class: 'panel', 'aria-label': 'Manifest' },
    body,
    h('details', { class: 'raw' }, h('summary', null, 'As JSON'), raw),
  )
  const load = async () => {
    // The SDK checks the body against SessionManifestSchema and returns it as a plain record.
    const m = (await ctx.client.sessions.manifest(state.id, { signal: ctx.signal })) as SessionManifest
    fill(
      body,
      h(
        'div',
        { class: 'manifest-grid' },
        section('Agent and runtime', agentRows(m)),
        section('Workspace', workspaceRows(m, state.id)),
        section('Last turn', lastTurnRows(m)),
        section(
          'Limits',
          fields(m.limits as Record<string, unknown>, 'No limits beyond the server defaults.'),
        ),
      ),
      section('Policies', fields(m.policies as Record<string, unknown>)),
    )
    fill(raw, highlight(JSON.stringify(m, null, 2), 'manifest.json'))
  }
  return { el, show: () => void load().catch(ctx.report) }
}
