import type { SecretList, SecretScope } from '@cairn/sdk'
import { fill, h, timeAgo } from '../dom.js'
import { act, button, confirmDialog, emptyRow, label, type PageContext, section } from '../ui.js'

const SCOPES: SecretScope[] = ['runtime', 'setup', 'proxy']

/** An agent's secrets by name: set and delete them; their values are never shown (the API never returns them). */
export function secretsSection(ctx: PageContext, agent: string): HTMLElement {
  const secrets = ctx.client.secrets
  const tbody = h('tbody')
  const missing = h('p', { class: 'warning', hidden: true, id: 'secrets-missing' })
  const names = h('datalist', { id: 'secret-names' })
  const nameInput = h('input', {
    id: 'secret-name',
    type: 'text',
    list: 'secret-names',
    autocomplete: 'off',
    spellcheck: 'false',
    pattern: '[A-Za-z_][A-Za-z0-9_]*',
    required: true,
  })
  const valueInput = h('input', {
    id: 'secret-value',
    type: 'password',
    autocomplete: 'new-password',
    required: true,
  })
  const scope = h(
    'select',
    { id: 'secret-scope' },
    SCOPES.map((s) => h('option', { value: s }, s)),
  )
  const save = h('button', { type: 'submit', class: 'primary', id: 'secret-save' }, 'Set secret')

  const render = (list: SecretList) => {
    fill(
      tbody,
      list.data.length
        ? list.data.map((s) => {
            const remove = button('Delete', { class: 'danger', 'data-secret': s.name })
            remove.addEventListener('click', async () => {
              if (!(await confirmDialog(`Delete the secret ${s.name} of ${agent}?`, 'Delete secret'))) return
              await act(ctx, remove, async () => {
                await secrets.delete(agent, s.name)
                await load()
                ctx.notify(`Secret ${s.name} deleted.`)
              })
            })
            return h(
              'tr',
              null,
              h('td', { 'data-label': 'Name', class: 'mono' }, s.name),
              h('td', { 'data-label': 'Scope' }, s.scope),
              h('td', { 'data-label': 'Value', class: 'muted' }, '•••••• (hidden)'),
              h('td', { 'data-label': 'Updated' }, timeAgo(s.updatedAt)),
              h('td', { 'data-label': '' }, remove),
            )
          })
        : emptyRow(5, 'No secrets set.'),
    )
    missing.hidden = list.missing.length === 0
    missing.textContent = `Required by the agent but not set: ${list.missing.join(', ')}. Sessions cannot start until they are.`
    fill(
      names,
      list.missing.map((n) => h('option', { value: n })),
    )
  }

  const load = async () => render(await secrets.list(agent, { signal: ctx.signal }))

  const form = h(
    'form',
    { class: 'row wrap toolbar', 'aria-label': 'Set a secret' },
    label('Name', nameInput),
    label('Value', valueInput),
    label('Scope', scope),
    save,
    names,
  )
  form.addEventListener('submit', (event) => {
    event.preventDefault()
    const name = nameInput.value.trim()
    const value = valueInput.value
    void act(ctx, save, async () => {
      const list = await secrets.set(agent, { [name]: value }, { scope: scope.value as SecretScope })
      nameInput.value = ''
      valueInput.value = ''
      render(list)
      ctx.notify(`Secret ${name} set.`)
    })
  })

  load().catch(ctx.report)
  return section(
    'Secrets',
    h(
      'p',
      { class: 'muted small' },
      'Encrypted at rest. Values are write-only: neither the API nor this page can show them.',
    ),
    missing,
    h(
      'table',
      { class: 'list', id: 'secrets-table' },
      h(
        'thead',
        null,
        h(
          'tr',
          null,
          ['Name', 'Scope', 'Value', 'Updated', ''].map((t) => h('th', { scope: 'col' }, t)),
        ),
      ),
      tbody,
    ),
    form,
  )
}
