import type { FileEntry } from '@cairn/sdk'
import { fill, formatBytes, h, saveBlob, timeAgo } from '../dom.js'
import { highlight } from '../highlight.js'
import { act, button, label, type PageContext } from '../ui.js'
import type { Panel, SessionState } from './session-state.js'

/** Files larger than this are offered for download instead of shown. */
const VIEW_LIMIT = 2 * 1024 * 1024
const IMAGE_TYPES: Record<string, string> = {
  png: 'image/png',
  jpg: 'image/jpeg',
  jpeg: 'image/jpeg',
  gif: 'image/gif',
  webp: 'image/webp',
  avif: 'image/avif',
  bmp: 'image/bmp',
  ico: 'image/x-icon',
  svg: 'image/svg+xml',
}
const SVG = 'image/svg+xml'

function base64(bytes: Uint8Array): string {
  let binary = ''
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000))
  }
  return btoa(binary)
}

const extension = (path: string) => (path.split('/').pop() ?? '').split('.').pop()?.toLowerCase() ?? ''

/** The workspace file tree (live, or a snapshot's) with a viewer and downloads. */
export function filesPanel(
  ctx: PageContext,
  state: SessionState,
): Panel & { source(snapshotId?: string): void } {
  const files = ctx.client.sessions.files(state.id)
  const sourceSelect = h('select', { id: 'files-source' }, h('option', { value: '' }, 'Live workspace'))
  const refresh = button('Refresh', { id: 'files-refresh' })
  const exportButton = button('Download all (.tar.gz)', { id: 'files-export' })
  const tree = h('ul', { class: 'tree', id: 'file-tree' })
  const viewer = h('div', { class: 'viewer', id: 'file-viewer', 'aria-live': 'polite' })
  let wantedSource: string | undefined
  let openPath: string | undefined
  let objectUrl: string | undefined

  const snapshot = () => sourceSelect.value || undefined
  /** Open directories stay open across reloads. */
  const expanded = new Set<string>()

  const listing = async (dir: string, into: HTMLElement) => {
    const entries = await files.list(dir, { snapshot: snapshot(), signal: ctx.signal })
    entries.sort(
      (a, b) =>
        Number(b.type === 'directory') - Number(a.type === 'directory') || a.name.localeCompare(b.name),
    )
    fill(
      into,
      entries.length
        ? entries.map(node)
        : h('li', { class: 'muted' }, dir ? '(empty)' : 'The workspace is empty.'),
    )
    await Promise.all(
      [...into.querySelectorAll<HTMLElement>(':scope > li > button.dir')]
        .filter((b) => expanded.has(b.dataset.path ?? ''))
        .map((b) => expand(b, b.nextElementSibling as HTMLElement)),
    )
  }

  const expand = async (toggle: HTMLElement, children: HTMLElement) => {
    toggle.setAttribute('aria-expanded', 'true')
    children.hidden = false
    expanded.add(toggle.dataset.path ?? '')
    await listing(toggle.dataset.path ?? '', children)
  }

  const node = (entry: FileEntry): HTMLElement => {
    if (entry.type === 'directory') {
      const children = h('ul', { hidden: true })
      const toggle = button(`${entry.name}/`, {
        class: 'dir',
        'aria-expanded': 'false',
        'data-path': entry.path,
      })
      toggle.addEventListener('click', () =>
        act(ctx, toggle, async () => {
          if (toggle.getAttribute('aria-expanded') !== 'true') return expand(toggle, children)
          toggle.setAttribute('aria-expanded', 'false')
          children.hidden = true
          expanded.delete(entry.path)
        }),
      )
      return h('li', null, toggle, children)
    }
    const open = button([entry.name, entry.type === 'symlink' ? ` → ${entry.target ?? ''}` : ''], {
      class: 'file',
      'data-path': entry.path,
    })
    open.append(h('span', { class: 'muted small' }, formatBytes(entry.size)))
    open.addEventListener('click', () => act(ctx, open, () => view(entry)))
    return h('li', null, open)
  }

  const download = (entry: FileEntry) =>
    act(ctx, null, async () => {
      const bytes = await files.read(entry.path, { snapshot: snapshot() })
      saveBlob(new Blob([bytes as BlobPart]), entry.name)
    })

  const view = async (entry: FileEntry) => {
    openPath = entry.path
    for (const b of tree.querySelectorAll('button.file')) {
      b.classList.toggle('selected', (b as HTMLElement).dataset.path === entry.path)
    }
    if (objectUrl) URL.revokeObjectURL(objectUrl)
    objectUrl = undefined
    const save = button('Download', { id: 'file-download', onclick: () => void download(entry) })
    const head = h(
      'div',
      { class: 'row spread wrap viewer-head' },
      h(
        'div',
        null,
        h('strong', { class: 'mono' }, entry.path),
        h(
          'span',
          { class: 'muted small' },
          ` ${formatBytes(entry.size)} · modified `,
          timeAgo(entry.modifiedAt),
        ),
      ),
      save,
    )
    if (entry.type !== 'file') return fill(viewer, head, h('p', { class: 'muted' }, `A ${entry.type}.`))
    if (entry.size > VIEW_LIMIT)
      return fill(viewer, head, h('p', { class: 'muted' }, 'Too large to show here: download it.'))
    fill(viewer, head, h('p', { class: 'muted' }, 'Loading…'))
    const bytes = await files.read(entry.path, { snapshot: snapshot(), signal: ctx.signal })
    if (openPath !== entry.path) return
    const image = IMAGE_TYPES[extension(entry.path)]
    if (image) {
      // An object URL is of the console's origin: an SVG (it may hold scripts) opened from it in a
      // tab would run next to the API key. A data: URL opens with an opaque origin instead.
      if (image !== SVG) objectUrl = URL.createObjectURL(new Blob([bytes as BlobPart], { type: image }))
      const src = objectUrl ?? `data:${SVG};base64,${base64(bytes)}`
      return fill(viewer, head, h('img', { src, alt: entry.path, class: 'preview' }))
    }
    let text: string | undefined
    try {
      text = new TextDecoder('utf-8', { fatal: true }).decode(bytes)
      if (text.includes('\u0000')) text = undefined
    } catch {
      text = undefined
    }
    if (text === undefined)
      return fill(viewer, head, h('p', { class: 'muted' }, 'A binary file: download it to open it.'))
    fill(
      viewer,
      head,
      h(
        'pre',
        { class: 'code', tabindex: '0', 'aria-label': `Contents of ${entry.path}` },
        highlight(text, entry.path),
      ),
    )
  }

  const loadSources = async () => {
    const snapshots = await ctx.client.sessions.snapshots(state.id).list({ signal: ctx.signal })
    const keep = wantedSource ?? sourceSelect.value
    fill(
      sourceSelect,
      h('option', { value: '' }, 'Live workspace'),
      [...snapshots]
        .reverse()
        .map((s) =>
          h(
            'option',
            { value: s.id },
            `Snapshot after turn ${s.turn}${s.label ? ` — ${s.label}` : ''} (${s.reason})`,
          ),
        ),
    )
    sourceSelect.value = snapshots.some((s) => s.id === keep) ? keep : ''
    wantedSource = undefined
  }

  const reload = async () => {
    tree.setAttribute('aria-busy', 'true')
    try {
      await loadSources()
      await listing('', tree)
    } finally {
      tree.removeAttribute('aria-busy')
    }
    if (!openPath) return fill(viewer, h('p', { class: 'muted' }, 'Choose a file to see it here.'))
    const wanted = openPath
    const parent = wanted.includes('/') ? wanted.slice(0, wanted.lastIndexOf('/')) : ''
    const siblings = await files.list(parent, { snapshot: snapshot(), signal: ctx.signal }).catch(() => [])
    // A file clicked while this looked for the one open before stays open: it is the newer choice.
    if (openPath !== wanted) return
    const entry = siblings.find((e) => e.path === wanted)
    if (entry) await view(entry)
    else fill(viewer, h('p', { class: 'muted' }, `${wanted} is not in this view.`))
  }

  sourceSelect.addEventListener('change', () => {
    openPath = undefined
    void act(ctx, null, reload)
  })
  refresh.addEventListener('click', () => act(ctx, refresh, reload))
  exportButton.addEventListener('click', () =>
    act(ctx, exportButton, async () => {
      const stream = await files.export({ snapshot: snapshot() })
      saveBlob(await new Response(stream).blob(), `${snapshot() ?? state.id}.tar.gz`)
    }),
  )

  const el = h(
    'section',
    { class: 'panel', 'aria-label': 'Files' },
    h('div', { class: 'row wrap toolbar' }, label('Show', sourceSelect), refresh, exportButton),
    h(
      'div',
      { class: 'files' },
      h('nav', { class: 'tree-box', 'aria-label': 'Workspace files' }, tree),
      viewer,
    ),
  )
  return {
    el,
    show: () => void act(ctx, null, reload),
    source: (snapshotId) => {
      wantedSource = snapshotId ?? ''
      openPath = undefined
    },
  }
}
