import type { Cairn } from '@cairn/sdk'
import { isAborted } from './api.js'
import { type Attrs, type Child, h } from './dom.js'

/** What a page gets from the shell. `signal` aborts when the page is left. */
export interface PageContext {
  client: Cairn
  main: HTMLElement
  signal: AbortSignal
  /** Goes to a route; `notice` is shown on the page it opens. */
  navigate(hash: string, notice?: string): void
  /** Shows an error (the API's message) in the page's alert area. */
  report(error: unknown): void
  /** Shows a short confirmation in the status area. */
  notify(message: string): void
  /** Clears the alert and status areas. */
  clearMessages(): void
}

/** A mounted page; `update` takes a new route of the same page without remounting it. */
export interface Page {
  update?(parts: string[]): void
}

/** A status pill; `live` marks a current status (an active one pulses). */
export function statusBadge(status: string, live = false): HTMLElement {
  return h('span', { class: `badge status-${status.toLowerCase()}${live ? ' live' : ''}` }, status)
}

export function button(label: Child, attrs: Attrs = {}): HTMLButtonElement {
  return h('button', { type: 'button', ...attrs }, label)
}

/** Runs an action from a button: disabled while it runs, errors reported. Resolves to false on error. */
export async function act(
  ctx: PageContext,
  control: HTMLButtonElement | null,
  run: () => Promise<unknown>,
): Promise<boolean> {
  if (control) {
    control.disabled = true
    control.setAttribute('aria-busy', 'true')
  }
  try {
    ctx.clearMessages()
    await run()
    return true
  } catch (error) {
    if (!isAborted(error)) ctx.report(error)
    return false
  } finally {
    if (control) {
      control.disabled = false
      control.removeAttribute('aria-busy')
    }
  }
}

/** Calls `run` now and then every `ms` until `signal` aborts; skipped while the tab is hidden. */
export function poll(ms: number, signal: AbortSignal, run: () => Promise<void>): void {
  let timer: ReturnType<typeof setTimeout> | undefined
  const tick = async () => {
    if (signal.aborted) return
    // A failed tick is retried on the next one; the page shows the last good data meanwhile.
    if (!document.hidden) await run().catch(() => undefined)
    if (!signal.aborted) timer = setTimeout(tick, ms)
  }
  signal.addEventListener('abort', () => clearTimeout(timer), { once: true })
  timer = setTimeout(tick, ms)
}

/** A modal confirmation (keyboard: Tab between the buttons, Escape cancels). */
export function confirmDialog(message: string, confirmLabel: string, danger = true): Promise<boolean> {
  return new Promise((resolve) => {
    const ok = button(confirmLabel, { class: danger ? 'danger' : 'primary', value: 'ok' })
    const cancel = button('Cancel', { value: 'cancel' })
    const dialog = h(
      'dialog',
      { class: 'confirm', 'aria-labelledby': 'confirm-text' },
      h('p', { id: 'confirm-text' }, message),
      h('div', { class: 'row end' }, cancel, ok),
    )
    let answer = false
    ok.addEventListener('click', () => {
      answer = true
      dialog.close()
    })
    cancel.addEventListener('click', () => dialog.close())
    dialog.addEventListener('close', () => {
      dialog.remove()
      resolve(answer)
    })
    document.body.append(dialog)
    dialog.showModal()
    cancel.focus()
  })
}

export function section(title: string, ...children: Child[]): HTMLElement {
  return h('section', { class: 'card' }, h('h2', null, title), ...children)
}

export function emptyRow(columns: number, text: string): HTMLTableRowElement {
  return h('tr', null, h('td', { colspan: columns, class: 'muted' }, text))
}

export function label(text: string, control: HTMLElement): HTMLLabelElement {
  return h('label', null, h('span', null, text), control)
}
