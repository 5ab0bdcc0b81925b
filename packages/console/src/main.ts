import './styles/index.css'
import type { Cairn } from '@cairn/sdk'
import { describeError, forgetKey, isUnauthorized, makeClient, storedKey, storeKey } from './api.js'
import { fill, h } from './dom.js'
import { agentPage, agentsPage } from './pages/agents.js'
import { sessionPage } from './pages/session.js'
import { sessionsPage } from './pages/sessions.js'
import { usagePage } from './pages/usage.js'
import { button, type Page, type PageContext } from './ui.js'

const app = document.getElementById('app') as HTMLElement
let current: { key: string; page: Page; controller: AbortController } | undefined
let shell: { main: HTMLElement; alert: HTMLElement; status: HTMLElement; nav: HTMLElement } | undefined
let client: Cairn | undefined
let pendingNotice: string | undefined

/** `#/sessions/ses_1/files` → ['sessions', 'ses_1', 'files']. */
function routeParts(): string[] {
  const hash = location.hash.replace(/^#\/?/, '')
  return hash.split('/').filter(Boolean).map(decodeURIComponent)
}

function routeKey(parts: string[]): string {
  const [section = 'sessions', id] = parts
  return id ? `${section}:${id}` : section
}

function signInPage(message?: string): void {
  current?.controller.abort()
  current = undefined
  shell = undefined
  client = undefined
  const input = h('input', {
    id: 'api-key',
    type: 'password',
    autocomplete: 'off',
    spellcheck: 'false',
    required: true,
    placeholder: 'cairn_…',
  })
  const error = h('p', { class: 'alert', role: 'alert', hidden: !message }, message ?? '')
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Sign in')
  const form = h(
    'form',
    { class: 'card signin', 'aria-labelledby': 'signin-title' },
    h('h1', { id: 'signin-title' }, 'Cairn console'),
    h('p', { class: 'muted' }, 'Sign in with an API key of this server. It is kept in this tab only.'),
    h('label', { for: 'api-key' }, 'API key'),
    input,
    error,
    submit,
  )
  form.addEventListener('submit', async (event) => {
    event.preventDefault()
    const key = input.value.trim()
    if (!key) return
    submit.disabled = true
    try {
      const candidate = makeClient(key)
      await candidate.agents.list()
      storeKey(key)
      input.value = ''
      start(candidate)
    } catch (e) {
      error.textContent = isUnauthorized(e)
        ? 'The server rejected this API key. Check it and try again.'
        : describeError(e)
      error.hidden = false
      input.select()
    } finally {
      submit.disabled = false
    }
  })
  fill(app, h('main', { class: 'center', id: 'main' }, form))
  input.focus()
}

function signOut(message?: string): void {
  forgetKey()
  history.replaceState(null, '', location.pathname)
  signInPage(message)
}

function buildShell(): NonNullable<typeof shell> {
  const skip = h('a', { class: 'skip', href: '#main-content' }, 'Skip to content')
  const main = h('main', { id: 'main-content', tabindex: '-1' })
  skip.addEventListener('click', (event) => {
    event.preventDefault()
    main.focus()
  })
  const link = (hash: string, text: string) => h('a', { href: hash, 'data-section': hash.slice(2) }, text)
  const nav = h(
    'nav',
    { 'aria-label': 'Main' },
    link('#/sessions', 'Sessions'),
    link('#/agents', 'Agents'),
    link('#/usage', 'Usage'),
  )
  const header = h(
    'header',
    { class: 'top' },
    h('a', { class: 'brand', href: '#/sessions' }, 'Cairn'),
    nav,
    button('Sign out', { class: 'link', onclick: () => signOut() }),
  )
  const alert = h('div', { class: 'alert', role: 'alert', hidden: true })
  const status = h('div', { class: 'notice', role: 'status', 'aria-live': 'polite', hidden: true })
  fill(app, skip, header, h('div', { class: 'messages' }, alert, status), main)
  return { main, alert, status, nav }
}

function context(controller: AbortController): PageContext {
  const s = shell as NonNullable<typeof shell>
  return {
    client: client as Cairn,
    main: s.main,
    signal: controller.signal,
    navigate: (hash, notice) => {
      pendingNotice = notice
      location.hash = hash
    },
    report: (error) => {
      if (controller.signal.aborted) return
      if (isUnauthorized(error)) return signOut('The server no longer accepts this API key. Sign in again.')
      s.alert.textContent = describeError(error)
      s.alert.hidden = false
    },
    notify: (message) => {
      s.status.textContent = message
      s.status.hidden = false
    },
    clearMessages: () => {
      s.alert.hidden = true
      s.status.hidden = true
    },
  }
}

function render(): void {
  if (!client || !shell) return
  const parts = routeParts()
  const key = routeKey(parts)
  if (current?.key === key && current.page.update) {
    current.page.update(parts)
    return
  }
  current?.controller.abort()
  const controller = new AbortController()
  const ctx = context(controller)
  ctx.clearMessages()
  shell.main.replaceChildren()
  const [section = 'sessions', id, tab] = parts
  for (const a of shell.nav.querySelectorAll('a')) {
    if (a.dataset.section === section) a.setAttribute('aria-current', 'page')
    else a.removeAttribute('aria-current')
  }
  let page: Page
  if (section === 'sessions' && id) page = sessionPage(ctx, id, tab)
  else if (section === 'agents' && id) page = agentPage(ctx, id)
  else if (section === 'agents') page = agentsPage(ctx)
  else if (section === 'usage') page = usagePage(ctx)
  else page = sessionsPage(ctx)
  current = { key, page, controller }
  if (pendingNotice) ctx.notify(pendingNotice)
  pendingNotice = undefined
  shell.main.focus({ preventScroll: true })
  window.scrollTo(0, 0)
}

function start(signedIn: Cairn): void {
  client = signedIn
  shell = buildShell()
  if (!location.hash.startsWith('#/')) history.replaceState(null, '', '#/sessions')
  render()
}

window.addEventListener('hashchange', () => {
  if (location.hash.startsWith('#/')) render()
})

const key = storedKey()
if (key) start(makeClient(key))
else signInPage()
