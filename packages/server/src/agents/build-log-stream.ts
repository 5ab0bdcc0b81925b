import type { RevisionInfo } from '@cairn/protocol'
import type { SseWriter } from '../http/sse.js'
import type { AgentService } from './agent-service.js'

/**
 * Streams a build log to a follower: the lines after event `after` (each line's id is its number
 * from 1), then the live ones while the build runs, then `end` (id: the line count + 1). Resolves
 * once the end was sent or the follower went.
 */
export function followBuildLog(
  agents: AgentService,
  rev: string,
  revision: Pick<RevisionInfo, 'status' | 'error'>,
  after: number,
  writer: SseWriter,
): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    let sent = after
    const line = (index: number, text: string) => {
      if (index <= sent) return
      writer.sendNamed('log', { line: text }, index)
      sent = index
    }
    const end = (index: number, status: string, error: string | null) => {
      if (index > after) writer.sendNamed('end', { status, error }, index)
      resolve()
    }
    const unsubscribe = agents.logs.subscribe(rev, (event) => {
      if (event.type === 'log') line(event.index, event.line)
      else end(event.index, event.status, event.error ?? null)
    })
    writer.onClose(() => {
      unsubscribe()
      resolve()
    })
    agents.logs.read(rev).then(async (lines) => {
      for (const [i, text] of lines.entries()) line(i + 1, text)
      if (agents.logs.isLive(rev)) return
      const latest = await agents.store.revision(rev)
      end(lines.length + 1, latest?.status ?? revision.status, latest?.error ?? null)
    }, reject)
  })
}
