import '@xterm/xterm/css/xterm.css'
import type { CommandInfo } from '@cairn/protocol'
import { FitAddon } from '@xterm/addon-fit'
import { Terminal } from '@xterm/xterm'
import { storedKey } from '../api.js'
import { h } from '../dom.js'
import { act, button, type PageContext } from '../ui.js'
import type { Panel, SessionState } from './session-state.js'

/** A login shell in `/workspace`: bash where the image has it, else sh. */
const SHELL = ['/bin/sh', '-c', 'if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi']
const FALLBACK_SIZE = { rows: 30, cols: 100 }

type ServerMessage = { type: 'exit'; command: CommandInfo } | { type: 'error'; error: { message: string } }

/**
 * A shell in the session's sandbox: a `tty` command over the terminal WebSocket (docs/commands.md),
 * drawn by xterm.js. Keystrokes go as binary messages, a resize as `{"type":"resize"}`; output
 * arrives as binary messages. Leaving the tab closes the socket (the shell runs on, and coming back
 * reattaches from the bytes already shown); leaving the session hangs the shell up.
 */
export function terminalPanel(ctx: PageContext, state: SessionState): Panel {
  const status = h('p', { class: 'muted', id: 'terminal-status', role: 'status' }, 'Starting a shell…')
  const restart = button('New shell', { id: 'terminal-new', hidden: true })
  const screen = h('div', { class: 'terminal', id: 'terminal-screen' })
  const term = new Terminal({ convertEol: false, cursorBlink: true, fontSize: 14, scrollback: 5000 })
  const fit = new FitAddon()
  term.loadAddon(fit)
  let opened = false
  let socket: WebSocket | undefined
  let command: CommandInfo | undefined
  let offset = 0
  let running = false
  /** Keys typed while the socket connects: sent once it is open, so none is lost. */
  let pending: Uint8Array[] = []
  const encoder = new TextEncoder()

  const send = (data: Uint8Array | string) => {
    if (socket?.readyState === WebSocket.OPEN) socket.send(data)
    else if (typeof data !== 'string') pending.push(data)
  }
  term.onData((data) => send(encoder.encode(data)))
  term.onBinary((data) => send(Uint8Array.from(data, (c) => c.charCodeAt(0))))
  term.onResize(({ rows, cols }) => send(JSON.stringify({ type: 'resize', rows, cols })))

  const size = () => {
    if (!screen.isConnected || screen.offsetParent === null) return undefined
    fit.fit()
    return { rows: term.rows, cols: term.cols }
  }

  const connect = () => {
    if (!command) return
    const path = `/v1/sessions/${state.id}/commands/${command.id}/terminal?offset=${offset}`
    const ws = new WebSocket(`${location.origin.replace(/^http/, 'ws')}${path}`, [
      `cairn-key.${storedKey() ?? ''}`,
    ])
    ws.binaryType = 'arraybuffer'
    ws.onopen = () => {
      status.textContent = `Shell ${command?.id} in /workspace.`
      const now = size()
      if (now) ws.send(JSON.stringify({ type: 'resize', ...now }))
      for (const data of pending) ws.send(data)
      pending = []
      term.focus()
    }
    ws.onmessage = (event) => {
      if (event.data instanceof ArrayBuffer) {
        offset += event.data.byteLength
        term.write(new Uint8Array(event.data))
        return
      }
      const message = JSON.parse(String(event.data)) as ServerMessage
      if (message.type === 'error') status.textContent = `Refused: ${message.error.message}`
      if (message.type === 'exit') exited(message.command)
    }
    ws.onclose = () => {
      if (socket === ws) socket = undefined
    }
    socket = ws
  }

  const exited = (info: CommandInfo) => {
    running = false
    const how = info.exitCode !== null ? `exit ${info.exitCode}` : (info.signal ?? info.endCause ?? 'ended')
    status.textContent = `The shell exited (${how}).`
    restart.hidden = false
  }

  const start = async () => {
    restart.hidden = true
    pending = []
    offset = 0
    term.reset()
    status.textContent = 'Starting a shell…'
    command = await ctx.client.sessions
      .commands(state.id)
      .start(SHELL, { tty: size() ?? FALLBACK_SIZE, signal: ctx.signal })
    running = true
    connect()
  }

  const show = () => {
    if (!opened) {
      term.open(screen)
      adoptStyles(screen)
      opened = true
    }
    if (socket) return
    if (running) connect()
    else if (!command) void act(ctx, restart, start)
  }

  restart.addEventListener('click', () => void act(ctx, restart, start))
  // Leaving the session page: the shell is hung up, as a closed terminal window would.
  ctx.signal.addEventListener('abort', () => {
    if (running) socket?.send(JSON.stringify({ type: 'signal', signal: 'SIGHUP' }))
    socket?.close()
    term.dispose()
  })
  new ResizeObserver(() => size()).observe(screen)
  const el = h(
    'section',
    { class: 'panel', 'aria-label': 'Terminal' },
    h('div', { class: 'row spread' }, status, restart),
    screen,
  )
  return { el, show, hide: () => socket?.close() }
}

/**
 * The console's CSP takes no inline style: xterm's own <style> elements (its colours, cursor and row
 * sizes) are copied into a constructed style sheet, which the CSP allows, each time they change.
 */
function adoptStyles(root: HTMLElement): void {
  const sheet = new CSSStyleSheet()
  document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet]
  const copy = () =>
    sheet.replaceSync([...root.querySelectorAll('style')].map((style) => style.textContent).join('\n'))
  new MutationObserver(copy).observe(root, { childList: true, subtree: true, characterData: true })
  copy()
}
