import type { TranscriptLine } from '@cairn/protocol'
import type { SessionStore } from './session-store.js'

/**
 * The conversation before a turn, for the agent. Read from the database once per warm sandbox,
 * then extended turn by turn in memory (reading every turn back was O(turns) per turn).
 */
export class TranscriptCache {
  private readonly transcripts = new Map<string, { seq: number; lines: TranscriptLine[] }>()

  constructor(private readonly store: SessionStore) {}

  /** The conversation before turn `seq`. */
  async before(sessionId: string, seq: number): Promise<TranscriptLine[]> {
    const cached = this.transcripts.get(sessionId)
    if (cached && cached.seq === seq - 1) return cached.lines
    const lines: TranscriptLine[] = []
    for (const turn of await this.store.transcript(sessionId, seq)) {
      lines.push({ v: 1, role: 'user', turn: turn.seq, content: turn.prompt })
      if (turn.response) lines.push({ v: 1, role: 'assistant', turn: turn.seq, content: turn.response })
    }
    this.transcripts.set(sessionId, { seq: seq - 1, lines })
    return lines
  }

  remember(sessionId: string, seq: number, prompt: string, response: string): void {
    const cached = this.transcripts.get(sessionId)
    if (!cached || cached.seq !== seq - 1) {
      this.transcripts.delete(sessionId)
      return
    }
    cached.lines.push({ v: 1, role: 'user', turn: seq, content: prompt })
    if (response) cached.lines.push({ v: 1, role: 'assistant', turn: seq, content: response })
    cached.seq = seq
  }

  forget(sessionId: string): void {
    this.transcripts.delete(sessionId)
  }
}
