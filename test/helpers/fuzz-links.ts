import type { Rng } from './fuzz.js'

/** The ID prefixes a path parameter or body field takes, by its name. */
const PREFIX_OF_FIELD: Record<string, string> = {
  rev: 'rev_',
  snapshotId: 'snap_',
  snapshot: 'snap_',
  artifactId: 'art_',
  turnId: 'trn_',
  commandId: 'cmd_',
  sessionId: 'ses_',
  agent: 'agt_',
}

/** The prefix of a route's `{id}`, by the collection it names. */
const PREFIX_OF_COLLECTION: Record<string, string> = { sessions: 'ses_', agents: 'agt_', keys: 'key_' }

const ID = /^(ses|snap|art|key|agt|rev|trn|cmd)_[0-9a-z]{20}$/
/** Response headers that name what a request made (a message's session and turn). */
const ID_HEADERS = ['cairn-session-id', 'cairn-turn-id']

/**
 * The links between operations of a stateful fuzz run: every ID a successful POST handed out (a
 * session, its snapshots, turns and artifacts, an agent and its revisions, a key) is kept by
 * prefix, and later requests take their path parameters and ID fields from it, so an operation is
 * fuzzed on what another one just made, not only on what the run seeded. IDs the run seeded
 * beforehand are `protect`ed: a destructive request never takes one of those from here.
 */
export class LinkPool {
  private readonly byPrefix = new Map<string, string[]>()
  private readonly protectedIds = new Set<string>()
  /** IDs learned, and requests whose path carried one, with how many of those answered 2xx. */
  readonly counts = { learned: 0, linkedRequests: 0, linkedSuccesses: 0 }

  protect(...values: string[]): void {
    for (const value of values) this.protectedIds.add(value)
  }

  /** Takes the IDs a successful POST's answer names (its body, at any depth, and its headers). */
  learn(method: string, status: number, body: Buffer, headers: Record<string, string | undefined>): void {
    if (method !== 'POST' || status < 200 || status >= 300) return
    const found = new Set<string>()
    for (const name of ID_HEADERS) {
      const value = headers[name]
      if (value && ID.test(value)) found.add(value)
    }
    if (body.length < 1_000_000 && body[0] === 0x7b) {
      try {
        collect(JSON.parse(body.toString('utf8')), found, 0)
      } catch {
        // An event stream or another non-JSON answer: its headers said what it made.
      }
    }
    for (const id of found) this.add(id)
  }

  private add(id: string): void {
    if (this.protectedIds.has(id)) return
    const prefix = id.slice(0, id.indexOf('_') + 1)
    const list = this.byPrefix.get(prefix) ?? []
    if (list.includes(id)) return
    list.push(id)
    this.byPrefix.set(prefix, list)
    this.counts.learned++
  }

  /** A learned ID for a path parameter of `template` (or a body field) named `name`; undefined: none yet. */
  pick(rng: Rng, template: string, name: string): string | undefined {
    const prefix = name === 'id' ? PREFIX_OF_COLLECTION[template.split('/')[2] ?? ''] : PREFIX_OF_FIELD[name]
    const list = prefix === undefined ? undefined : this.byPrefix.get(prefix)
    return list && list.length > 0 ? rng.pick(list) : undefined
  }

  /** Whether a request path carries a learned ID (counted, with its answer, for the report). */
  count(path: string, status: number): void {
    const linked = path.split(/[/?&=]/).some((part) => {
      const prefix = part.slice(0, part.indexOf('_') + 1)
      return this.byPrefix.get(prefix)?.includes(part) === true
    })
    if (!linked) return
    this.counts.linkedRequests++
    if (status >= 200 && status < 300) this.counts.linkedSuccesses++
  }
}

function collect(value: unknown, found: Set<string>, depth: number): void {
  if (depth > 4) return
  if (typeof value === 'string') {
    if (ID.test(value)) found.add(value)
  } else if (Array.isArray(value)) {
    for (const item of value.slice(0, 50)) collect(item, found, depth + 1)
  } else if (value !== null && typeof value === 'object') {
    for (const item of Object.values(value)) collect(item, found, depth + 1)
  }
}
