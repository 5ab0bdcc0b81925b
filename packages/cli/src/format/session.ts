import type { Message, SessionInfo, StatusEvent } from '@cairn/protocol'
import { shortId } from './ids.js'
import { oneLine, stripTerminalEscapes } from './sanitize.js'
import { formatDuration, relativeTime } from './time.js'

export const SESSION_HEAD = ['ID', 'Agent', 'Title', 'Status', 'Msgs', 'Last Active']

export function sessionRow(s: SessionInfo, now: Date): string[] {
  return [
    shortId(s.id),
    oneLine(s.agentName, 24),
    oneLine(s.title ?? '-', 40),
    s.status,
    String(s.messageCount),
    relativeTime(s.lastActiveAt, now),
  ]
}

export function sessionFields(s: SessionInfo, now: Date): [string, string][] {
  return [
    ['ID', s.id],
    ['Agent', `${oneLine(s.agentName)} (${s.agentId})`],
    ['Title', oneLine(s.title ?? '-')],
    ['Status', `${s.status} (${s.statusCause})`],
    ...(s.approvalId
      ? ([['Awaiting approval', `${s.approvalId} (cairn sessions approvals)`]] as [string, string][])
      : []),
    ['Turns', String(s.turnCount)],
    ['Messages', String(s.messageCount)],
    ['Sandbox', s.warm ? 'warm' : 'stopped'],
    ['Revision', s.revisionId],
    ['Idle timeout', formatDuration(s.idleTimeoutMs)],
    ['Keep warm', formatDuration(s.keepWarmMs)],
    ...policyFields(s),
    ...(s.generation === undefined ? [] : ([['Generation', String(s.generation)]] as [string, string][])),
    ['Auto snapshots', s.autoSnapshots === false ? 'off' : 'on'],
    ['Created', `${s.createdAt} (${relativeTime(s.createdAt, now)})`],
    ['Last active', `${s.lastActiveAt} (${relativeTime(s.lastActiveAt, now)})`],
  ]
}

/** The limits of the lifecycle policy (absent from servers that predate it). */
function policyFields(s: SessionInfo): [string, string][] {
  const policy = s.policy as SessionInfo['policy'] | undefined
  if (!policy) return []
  return [
    ['Max turns', policy.maxTurns === null ? 'none' : `${policy.maxTurns} (${s.turnCount} used)`],
    [
      'Max duration',
      policy.maxDurationMs === null
        ? 'none'
        : `${formatDuration(policy.maxDurationMs)}${s.deadlineAt ? ` (until ${s.deadlineAt})` : ''}`,
    ],
    ['On timeout', policy.onTimeout],
    ...(policy.approvalTimeoutMs
      ? ([['Approval timeout', formatDuration(policy.approvalTimeoutMs)]] as [string, string][])
      : []),
  ]
}

/** The transcript, turn by turn: `You>` and `Agent>` blocks. */
export function renderTranscript(messages: Message[], label: (role: 'user' | 'assistant') => string): string {
  return messages
    .map((m) => {
      const text = stripTerminalEscapes(m.content).replace(/\n+$/, '')
      const status = m.status && m.status !== 'completed' ? ` [${m.status}]` : ''
      return `${label(m.role)} ${text}${status}`
    })
    .join('\n')
}

export function statusEventLine(e: StatusEvent): string {
  const from = e.from === null ? '∅' : oneLine(e.from)
  const detail = e.detail ? ` — ${oneLine(e.detail, 120)}` : ''
  return `${oneLine(e.at)}  ${from} → ${oneLine(e.to)}  (${oneLine(e.cause)})${detail}`
}
