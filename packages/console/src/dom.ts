/** A few DOM helpers. Text always goes in as text nodes (never as HTML), so nothing from the API is parsed. */

export type Child = Node | string | number | false | null | undefined | Child[]
type Listener = (event: Event) => void
export type Attrs = Record<string, string | number | boolean | Listener | undefined | null>

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs?: Attrs | null,
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag)
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue
    if (typeof value === 'function') el.addEventListener(name.slice(2).toLowerCase(), value)
    else if (value === true) el.setAttribute(name, '')
    else el.setAttribute(name, String(value))
  }
  append(el, children)
  return el
}

export function append(parent: Node, children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue
    if (Array.isArray(child)) append(parent, child)
    else parent.appendChild(child instanceof Node ? child : document.createTextNode(String(child)))
  }
}

/** Replaces the children of `el`. */
export function fill(el: Element, ...children: Child[]): void {
  el.replaceChildren()
  append(el, children)
}

export function formatBytes(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`
  const units = ['KiB', 'MiB', 'GiB', 'TiB']
  let value = bytes / 1024
  let unit = 0
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024
    unit++
  }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`
}

export function formatMs(ms: number | null | undefined): string {
  if (ms === null || ms === undefined) return '–'
  if (ms < 1000) return `${Math.round(ms)} ms`
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`
  if (ms < 3_600_000) return `${Math.floor(ms / 60_000)} min ${Math.round((ms % 60_000) / 1000)} s`
  if (ms < 86_400_000) return `${Math.floor(ms / 3_600_000)} h ${Math.round((ms % 3_600_000) / 60_000)} min`
  const days = ms / 86_400_000
  return `${Number.isInteger(days) ? days : days.toFixed(1)} days`
}

/** A `<time>` showing how long ago, with the full date as its title. */
export function timeAgo(iso: string | null | undefined): HTMLElement | string {
  if (!iso) return '–'
  const date = new Date(iso)
  if (Number.isNaN(date.getTime())) return iso
  const seconds = Math.round((Date.now() - date.getTime()) / 1000)
  let text: string
  if (seconds < 5) text = 'just now'
  else if (seconds < 60) text = `${seconds} s ago`
  else if (seconds < 3600) text = `${Math.floor(seconds / 60)} min ago`
  else if (seconds < 86_400) text = `${Math.floor(seconds / 3600)} h ago`
  else text = date.toLocaleDateString()
  return h('time', { datetime: iso, title: date.toLocaleString() }, text)
}

/** Saves bytes as a file through a temporary blob: URL (no key in any URL). */
export function saveBlob(blob: Blob, name: string): void {
  const url = URL.createObjectURL(blob)
  const link = h('a', { href: url, download: name, hidden: true })
  document.body.append(link)
  link.click()
  link.remove()
  setTimeout(() => URL.revokeObjectURL(url), 60_000)
}
