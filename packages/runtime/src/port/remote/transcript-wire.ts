import { createHash, type Hash } from 'node:crypto'
import type { TranscriptLine } from '@cairn/protocol'
import type { TurnInput } from '../../agent/types.js'

/**
 * A turn's transcript on the wire of the remote runtime port: a turn carries the conversation
 * before it, which grows by two lines a turn. Sent whole, a session's hundredth turn through an
 * API replica carried its hundred turns before it (encoded, sent, decoded and checked on every
 * turn: O(turns) bytes and CPU per turn, where one process passes an array). So the node keeps
 * the transcript it was last sent per session, and a caller that sent it sends only the lines
 * after it, naming what it builds on: the number of lines and their digest. A node that holds
 * something else (it restarted, another replica sent a different one, it let it go) answers
 * `retry` and the caller sends the transcript whole.
 */

/** The turn input as it crosses: `transcript` holds the lines after `transcriptFrom.lines`. */
export type WireTurnInput = TurnInput & { transcriptFrom?: { lines: number; digest: string } }

/** The digest of a transcript's lines, one after another: a running SHA-256 of their JSON lines. */
class LinesDigest {
  private readonly hash: Hash = createHash('sha256')
  lines = 0
  /** Characters hashed (the JSON of each line): what keeping them costs. */
  chars = 0
  digest = this.hash.copy().digest('base64')

  add(lines: readonly TranscriptLine[], from: number): void {
    if (from >= lines.length) return
    for (let i = from; i < lines.length; i++) {
      const json = `${JSON.stringify(lines[i])}\n`
      this.hash.update(json)
      this.chars += json.length
    }
    this.lines = lines.length
    this.digest = this.hash.copy().digest('base64')
  }
}

/** Least recently used first: a key used again goes to the end. */
function touch<K, V>(map: Map<K, V>, key: K, value: V): void {
  map.delete(key)
  map.set(key, value)
}

/** Sessions whose sent transcript a caller remembers (a digest and a line each, no lines). */
const SENT_SESSIONS_MAX = 10_000

/**
 * The caller's side (one per node connection): per session, how many lines it last sent, their
 * digest and the last of them (the same object in the next turn's transcript shows the lines
 * before it are the ones sent: the server's transcript cache only ever appends to its array).
 */
export class SentTranscripts {
  private readonly sent = new Map<string, { last: TranscriptLine | undefined; digest: LinesDigest }>()
  private whole = false

  /** From now on every transcript goes whole (the node does not know the lines-after form). */
  sendWhole(): void {
    this.whole = true
    this.sent.clear()
  }

  /**
   * The input to send for `sessionId`'s turn: with only the lines the node has not been sent
   * (`trimmed`), or whole (`whole`: the node asked for it, or nothing was sent before it).
   */
  wire(sessionId: string, input: TurnInput, whole = false): { input: WireTurnInput; trimmed: boolean } {
    const { transcript } = input
    if (this.whole) return { input, trimmed: false }
    const before = whole ? undefined : this.sent.get(sessionId)
    const lines = before?.digest.lines ?? 0
    const builds =
      before !== undefined && lines > 0 && transcript.length >= lines && transcript[lines - 1] === before.last
    if (builds) {
      const from = { lines, digest: before.digest.digest }
      before.digest.add(transcript, lines)
      before.last = transcript.at(-1)
      touch(this.sent, sessionId, before)
      return { input: { ...input, transcript: transcript.slice(lines), transcriptFrom: from }, trimmed: true }
    }
    const digest = new LinesDigest()
    digest.add(transcript, 0)
    touch(this.sent, sessionId, { last: transcript.at(-1), digest })
    if (this.sent.size > SENT_SESSIONS_MAX) this.sent.delete(this.sent.keys().next().value as string)
    return { input, trimmed: false }
  }
}

/** Characters of transcripts a node keeps for its callers, all sessions together (JSON lines). */
export const KEPT_TRANSCRIPT_CHARS = 64 * 1024 * 1024

/**
 * The node's side: per session, the transcript it was last sent (whole or built up), least
 * recently used let go past `maxChars` (its session's next turn is then sent whole).
 */
export class KeptTranscripts {
  private readonly kept = new Map<string, { lines: TranscriptLine[]; digest: LinesDigest }>()
  private chars = 0

  constructor(private readonly maxChars = KEPT_TRANSCRIPT_CHARS) {}

  /**
   * The whole input of a turn as it came (a transcript sent whole, or the lines after one kept
   * here); undefined when it builds on lines this node does not hold (to be sent whole).
   */
  expand(sessionId: string, input: WireTurnInput): TurnInput | undefined {
    const { transcriptFrom, ...turn } = input
    const held = this.kept.get(sessionId)
    if (!transcriptFrom) {
      const lines = [...turn.transcript]
      const digest = new LinesDigest()
      digest.add(lines, 0)
      this.keep(sessionId, { lines, digest }, held)
      return { ...turn, transcript: lines }
    }
    if (!held || held.digest.lines !== transcriptFrom.lines || held.digest.digest !== transcriptFrom.digest)
      return undefined
    const from = held.lines.length
    // The array kept grows in place (as the server's transcript cache does): no copy per turn.
    held.lines.push(...turn.transcript)
    const charsBefore = held.digest.chars
    held.digest.add(held.lines, from)
    this.chars += held.digest.chars - charsBefore
    this.keep(sessionId, held, held)
    return { ...turn, transcript: held.lines }
  }

  /** How many sessions' transcripts are kept (for tests and metrics). */
  get size(): number {
    return this.kept.size
  }

  private keep(
    sessionId: string,
    entry: { lines: TranscriptLine[]; digest: LinesDigest },
    replaced: { digest: LinesDigest } | undefined,
  ): void {
    if (replaced && replaced !== entry) this.chars -= replaced.digest.chars
    if (replaced !== entry) this.chars += entry.digest.chars
    touch(this.kept, sessionId, entry)
    for (const [id, oldest] of this.kept) {
      if (this.chars <= this.maxChars) break
      this.kept.delete(id)
      this.chars -= oldest.digest.chars
    }
  }
}
