import { MAX_FORKS_PER_REQUEST } from '@cairn/protocol'
import { describeError } from '../api.js'
import { h } from '../dom.js'
import { button, label, type PageContext } from '../ui.js'
import type { SessionState } from './session-state.js'

/** Whether the session's sandbox driver can checkpoint memory on this server (`GET /v1/runtime`). */
async function memoryForkable(ctx: PageContext, id: string): Promise<boolean> {
  const [manifest, drivers] = await Promise.all([
    ctx.client.sessions.manifest(id, { signal: ctx.signal }),
    ctx.client.drivers({ signal: ctx.signal }),
  ])
  const driver = drivers.find((d) => d.name === manifest.driver)
  return driver?.available === true && driver.capabilities.memorySnapshot
}

interface ForkForm {
  title: HTMLInputElement
  count: HTMLInputElement
  memory: HTMLInputElement
  error: HTMLElement
}

function forkForm(base: string, withMemory: boolean) {
  const form: ForkForm = {
    title: h('input', {
      id: 'fork-title',
      type: 'text',
      maxlength: 200,
      value: `${base} (fork)`.slice(0, 200),
    }),
    count: h('input', { id: 'fork-count', type: 'number', min: 1, max: MAX_FORKS_PER_REQUEST, value: 1 }),
    memory: h('input', { id: 'fork-memory', type: 'checkbox' }),
    error: h('p', { class: 'alert', id: 'fork-error', role: 'alert', hidden: true }),
  }
  const memoryRow = withMemory
    ? h(
        'label',
        { class: 'check' },
        form.memory,
        ' With memory: its processes go on from this instant (a checkpoint of the running sandbox)',
      )
    : null
  return { form, fields: [label('Title', form.title), label('Count', form.count), memoryRow] }
}

/**
 * The fork dialog: N new sessions from the session as it is now (`POST …/forks`), "with memory"
 * offered only where its driver checkpoints memory. A refusal shows the API's error and code in
 * the dialog, which stays open. Resolves once it is closed.
 */
export async function forkDialog(ctx: PageContext, state: SessionState): Promise<void> {
  const withMemory = await memoryForkable(ctx, state.id)
  const base = state.info?.title || state.id
  const { form, fields } = forkForm(base, withMemory)
  const ok = button('Fork', { class: 'primary', id: 'fork-submit' })
  const cancel = button('Cancel')
  const dialog = h(
    'dialog',
    { class: 'confirm fork', 'aria-labelledby': 'fork-heading' },
    h('h2', { id: 'fork-heading' }, 'Fork this session'),
    h('div', { class: 'stack' }, ...fields),
    form.error,
    h('div', { class: 'row end' }, cancel, ok),
  )
  const submit = async () => {
    ok.disabled = true
    form.error.hidden = true
    try {
      const memory = withMemory && form.memory.checked
      const result = await ctx.client.sessions.snapshots(state.id).forks({
        memory,
        count: Number(form.count.value),
        title: form.title.value.trim() || undefined,
      })
      dialog.close()
      const ids = result.sessions.map((s) => s.id)
      const what = `${memory ? ' with its memory' : ''} into ${ids.join(', ')} (snapshot ${result.snapshot.id})`
      if (ids.length === 1) ctx.navigate(`#/sessions/${ids[0]}`, `Forked ${state.id}${what}.`)
      else ctx.navigate('#/sessions', `Forked ${state.id}${what}.`)
    } catch (error) {
      form.error.textContent = describeError(error)
      form.error.hidden = false
    } finally {
      ok.disabled = false
    }
  }
  ok.addEventListener('click', () => void submit())
  cancel.addEventListener('click', () => dialog.close())
  await new Promise<void>((resolve) => {
    dialog.addEventListener('close', () => {
      dialog.remove()
      resolve()
    })
    document.body.append(dialog)
    dialog.showModal()
    form.title.focus()
  })
}
