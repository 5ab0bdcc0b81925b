import type { ApprovalDecision, SessionInfo } from '@cairn/protocol'
import { fill, h, timeAgo } from '../dom.js'
import { act, button, type PageContext } from '../ui.js'
import type { SessionState } from './session-state.js'

/**
 * The request the session's agent waits on (human review, docs/approvals.md): its summary and
 * review snapshot, a note, and Approve and Deny (a read-only key is refused by the API: `forbidden`).
 */
export function approvalBox(ctx: PageContext, state: SessionState) {
  const text = h('div', { class: 'grow' })
  const note = h('input', {
    id: 'approval-note',
    type: 'text',
    placeholder: 'Note to the agent (optional)',
    autocomplete: 'off',
    maxlength: '4000',
  })
  const approve = button('Approve', { id: 'approval-approve', class: 'primary' })
  const deny = button('Deny', { id: 'approval-deny', class: 'danger' })
  const el = h(
    'section',
    { class: 'panel warning', id: 'approval', hidden: true, 'aria-label': 'Approval requested' },
    text,
    h('div', { class: 'row wrap' }, note, approve, deny),
  )
  let shown: string | undefined

  const answer = (control: HTMLButtonElement, decision: ApprovalDecision) =>
    act(ctx, control, async () => {
      if (!shown) return
      const notes = note.value.trim() ? { note: note.value.trim() } : {}
      const answered = await ctx.client.sessions.approvals(state.id).answer(shown, decision, notes)
      note.value = ''
      ctx.notify(`Request ${answered.id} ${answered.status}; the agent is told in its next turn.`)
      await state.refresh()
    })
  approve.addEventListener('click', () => void answer(approve, 'approve'))
  deny.addEventListener('click', () => void answer(deny, 'deny'))

  const onInfo = async (info: SessionInfo) => {
    const id = info.approvalId
    const request = id
      ? await ctx.client.sessions.approvals(state.id).get(id, { signal: ctx.signal })
      : undefined
    shown = request?.status === 'pending' ? request.id : undefined
    el.hidden = shown === undefined
    if (!request || !shown) return
    fill(
      text,
      h('strong', null, 'Approval requested: '),
      request.summary,
      h(
        'span',
        { class: 'muted' },
        ` (${request.id}, ${timeAgo(request.requestedAt)}${request.expiresAt ? `, expires ${request.expiresAt}` : ''})`,
      ),
      ...(request.snapshotId
        ? [' ', h('a', { href: `#/sessions/${state.id}/snapshots` }, `review snapshot ${request.snapshotId}`)]
        : []),
    )
  }
  return { el, onInfo: (info: SessionInfo) => void onInfo(info).catch(() => undefined) }
}
