import type { Approval, ApprovalDecision } from '@cairn/sdk'
import { jsonOption, type Register } from '../../command.js'
import { shortId } from '../../format/ids.js'
import { oneLine } from '../../format/sanitize.js'
import { renderTable } from '../../format/table.js'
import { resolveSession } from '../../session-arg.js'

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('approvals')
      .description("List the approval requests of a session's agent, newest first (human review)")
      .argument('<id>', 'session ID or a unique prefix of it'),
  ).action(async (id: string) => {
    const session = await resolveSession(ctx, id)
    const approvals = await session.approvals.list()
    if (ctx.json) return ctx.out.data(approvals)
    if (approvals.length === 0) {
      ctx.out.note('No approval requests.')
      return
    }
    const rows = approvals.map((a) => [
      a.id,
      a.status,
      oneLine(a.summary, 60),
      oneLine(a.requestedAt),
      a.snapshotId ? shortId(a.snapshotId) : '-',
    ])
    ctx.out.line(renderTable(['ID', 'Status', 'Summary', 'Requested', 'Snapshot'], rows, ctx.out.c.bold))
  })
}

/** `cairn sessions approve|deny <id> <approval>`: answers a request; a turn carries it to the agent. */
export function answerCommand(decision: ApprovalDecision): Register {
  return (parent, ctx) => {
    jsonOption(
      parent
        .command(decision)
        .description(
          `${decision === 'approve' ? 'Approve' : 'Deny'} an approval request of the session's agent`,
        )
        .argument('<id>', 'session ID or a unique prefix of it')
        .argument('<approval>', 'the request (apr_…)')
        .option('--note <text>', 'told to the agent with the answer'),
    ).action(async (id: string, approvalId: string, options: { note?: string }) => {
      const session = await resolveSession(ctx, id)
      const answered: Approval = await session.approvals.answer(approvalId, decision, { note: options.note })
      if (ctx.json) return ctx.out.data(answered)
      ctx.out.line(
        `${answered.id} ${answered.status}; the agent is told in turn ${answered.deliveredTurnId ?? '(its next)'}`,
      )
    })
  }
}
