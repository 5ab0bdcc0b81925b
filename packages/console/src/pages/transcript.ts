import type { Message, SessionInfo, TurnInfo } from '@cairn/sdk'
import { describeError } from '../api.js'
import { fill, formatMs, h } from '../dom.js'
import { button, type PageContext } from '../ui.js'
import type { Panel, SessionState } from './session-state.js'

const short = (value: unknown, max = 120): string => {
  const text = typeof value === 'string' ? value : JSON.stringify(value)
  if (text === undefined) return ''
  return text.length > max ? `${text.slice(0, max)}…` : text
}

/** The agent's side of one turn: text, tool calls and status lines in the order they came. */
class AgentReply {
  readonly el = h('div', { class: 'msg agent' })
  private readonly body = h('div', { class: 'body' })
  private readonly footer = h('div', { class: 'meta' })
  private text: HTMLElement | undefined
  private readonly tools = new Map<string, { el: HTMLElement; state: HTMLElement; started: number }>()

  constructor(turn?: number) {
    this.el.append(h('div', { class: 'who' }, 'Agent', turn ? ` · turn ${turn}` : ''), this.body, this.footer)
  }

  appendText(content: string): void {
    if (!this.text) {
      this.text = h('div', { class: 'text' })
      this.body.append(this.text)
    }
    this.text.append(content)
  }

  status(message: string): void {
    this.text = undefined
    this.body.append(h('div', { class: 'status-line' }, `· ${message}`))
  }

  toolStart(id: string, name: string, input: unknown): void {
    this.text = undefined
    const state = h('span', { class: 'tool-state running' }, 'running…')
    const el = h(
      'details',
      { class: 'tool', 'data-tool': name },
      h(
        'summary',
        null,
        h('span', { class: 'tool-name' }, name),
        input === undefined ? null : h('code', { class: 'tool-input' }, short(input)),
        ' ',
        state,
      ),
    )
    if (input !== undefined)
      el.append(h('div', { class: 'small muted' }, 'input'), h('pre', null, short(input, 4000)))
    this.body.append(el)
    this.tools.set(id, { el, state, started: performance.now() })
  }

  toolEnd(id: string, output: unknown, isError: boolean | undefined, durationMs: number | undefined): void {
    const tool = this.tools.get(id)
    if (!tool) return
    const ms = durationMs ?? performance.now() - tool.started
    tool.state.className = `tool-state ${isError ? 'error' : 'done'}`
    tool.state.textContent = `${isError ? '✗ failed' : '✓'} ${formatMs(ms)}`
    if (output !== undefined) {
      tool.el.append(h('div', { class: 'small muted' }, 'output'), h('pre', null, short(output, 20_000)))
    }
  }

  finish(text: string, cls = ''): void {
    this.footer.className = `meta ${cls}`
    this.footer.textContent = text
  }
}

function userMessage(content: string, turn?: number): HTMLElement {
  return h(
    'div',
    { class: 'msg user' },
    h('div', { class: 'who' }, 'You', turn ? ` · turn ${turn}` : ''),
    h('div', { class: 'text' }, content),
  )
}

export function transcriptPanel(ctx: PageContext, state: SessionState): Panel {
  const { client } = ctx
  const list = h('ol', { class: 'transcript', id: 'transcript', 'aria-label': 'Transcript' })
  /** Turns streamed in this page keep their tool calls (the stored transcript has text only). */
  const live = new Map<number, HTMLElement>()
  let streaming = false
  let loadedCount = -1
  const input = h('textarea', {
    id: 'message',
    rows: 3,
    placeholder: 'Message the agent (Enter sends, Shift+Enter for a new line)',
    'aria-describedby': 'message-hint',
  })
  const send = h('button', { type: 'submit', class: 'primary', id: 'send' }, 'Send')
  const cancel = button('Cancel turn', { id: 'cancel', hidden: true })
  const form = h(
    'form',
    { class: 'composer', 'aria-label': 'Send a message' },
    h('label', { for: 'message', class: 'visually-hidden' }, 'Message'),
    input,
    h(
      'div',
      { class: 'row spread' },
      h('span', { id: 'message-hint', class: 'muted small' }, ''),
      h('div', { class: 'row' }, cancel, send),
    ),
  )
  const el = h('section', { class: 'panel', 'aria-label': 'Transcript' }, list, form)

  const reply = (turn: number, content: string | undefined, info: TurnInfo | undefined) => {
    const r = new AgentReply(turn)
    if (content !== undefined) r.appendText(content)
    if (info && info.status !== 'running') {
      r.finish(`${info.status} · ${formatMs(info.durationMs)}`, info.status === 'completed' ? '' : 'error')
    } else if (info) r.finish('running…')
    if (info?.stderrTail) {
      r.el.append(
        h('details', { class: 'stderr' }, h('summary', null, 'stderr'), h('pre', null, info.stderrTail)),
      )
    }
    return r.el
  }

  const render = (messages: Message[], turns: TurnInfo[]) => {
    const byTurn = new Map(turns.map((t) => [t.seq, t]))
    const groups = new Map<number, Message[]>()
    for (const m of messages) groups.set(m.turn, [...(groups.get(m.turn) ?? []), m])
    const items: HTMLElement[] = []
    for (const [turn, group] of groups) {
      const cached = live.get(turn)
      if (cached) {
        items.push(cached)
        continue
      }
      const li = h('li', { class: 'turn', 'data-turn': turn })
      for (const m of group) {
        li.append(m.role === 'user' ? userMessage(m.content, turn) : reply(turn, m.content, byTurn.get(turn)))
      }
      if (!group.some((m) => m.role === 'assistant')) li.append(reply(turn, undefined, byTurn.get(turn)))
      items.push(li)
    }
    fill(
      list,
      items.length ? items : h('li', { class: 'muted empty' }, 'No messages yet. Say something below.'),
    )
  }

  const load = async () => {
    const [messages, turns] = await Promise.all([
      client.sessions.messages(state.id, { signal: ctx.signal }),
      client.sessions.turns(state.id, { signal: ctx.signal }),
    ])
    if (!streaming) render(messages, turns)
    loadedCount = messages.length
  }

  const nearBottom = () => window.innerHeight + window.scrollY >= document.body.scrollHeight - 120
  const follow = (was: boolean) => {
    if (was) window.scrollTo(0, document.body.scrollHeight)
  }

  const run = async (message: string) => {
    streaming = true
    send.disabled = true
    cancel.hidden = false
    list.querySelector('.empty')?.remove()
    const li = h('li', { class: 'turn live' }, userMessage(message))
    const reply = new AgentReply()
    li.append(reply.el)
    list.append(li)
    follow(true)
    const stream = client.sessions.stream(state.id, message)
    cancel.onclick = () => {
      cancel.disabled = true
      void stream.abort()
    }
    try {
      for await (const event of stream) {
        const atBottom = nearBottom()
        if (event.type === 'run.started') {
          li.dataset.turn = String(event.turn)
          li.querySelector('.msg.user .who')?.append(` · turn ${event.turn}`)
          reply.el
            .querySelector('.who')
            ?.append(` · turn ${event.turn}${event.coldStart ? ' · cold start' : ''}`)
          live.set(event.turn, li)
        } else if (event.type === 'message.delta') reply.appendText(event.content)
        else if (event.type === 'tool.start') reply.toolStart(event.toolCallId, event.name, event.input)
        else if (event.type === 'tool.end')
          reply.toolEnd(event.toolCallId, event.output, event.isError, event.durationMs)
        else if (event.type === 'status') reply.status(event.message)
        else if (event.type === 'run.completed') reply.finish(`completed · ${formatMs(event.durationMs)}`)
        else if (event.type === 'run.failed') {
          reply.finish(
            `failed · ${event.error.message} (${event.error.code}) · ${formatMs(event.durationMs)}`,
            'error',
          )
        } else if (event.type === 'run.cancelled')
          reply.finish(`cancelled · ${formatMs(event.durationMs)}`, 'error')
        follow(atBottom)
      }
    } catch (error) {
      reply.finish(describeError(error), 'error')
      ctx.report(error)
    } finally {
      streaming = false
      send.disabled = false
      cancel.hidden = true
      cancel.disabled = false
      li.classList.remove('live')
      // The turn's own outcome is shown already; these refreshes retry on the next poll.
      await state.refresh().catch(() => undefined)
      await load().catch(() => undefined)
      input.focus()
    }
  }

  form.addEventListener('submit', (event) => {
    event.preventDefault()
    const message = input.value
    if (!message.trim() || streaming) return
    input.value = ''
    ctx.clearMessages()
    void run(message)
  })
  input.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault()
      form.requestSubmit()
    }
  })

  return {
    el,
    show: () => {
      if (!streaming) load().catch(ctx.report)
    },
    onInfo: (info: SessionInfo) => {
      // A turn sent from elsewhere (CLI, SDK): show it once the transcript grows.
      // A background refresh: a failure keeps the transcript shown, the next poll tries again.
      if (!streaming && info.messageCount !== loadedCount && !el.hidden) load().catch(() => undefined)
      const hint = el.querySelector('#message-hint')
      if (hint) {
        hint.textContent =
          info.status === 'active' && !streaming
            ? 'A turn is running…'
            : info.status === 'completed' || info.status === 'failed' || info.status === 'timeout'
              ? 'Sending a message resumes the session.'
              : ''
      }
    },
  }
}
