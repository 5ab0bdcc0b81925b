/**
 * Counting the statements a server sends its database around one request (a warm turn): shared by
 * test/turn-statements.test.ts and bench/turn-statements.ts. The server's `statements` tap hears
 * each one as it is sent (`begin` and `commit` included: on PostgreSQL each is a round trip).
 */

/** What `statements` of a running server offers (the test's src and the bench's dist alike). */
export interface Tap {
  listen(listener: (sql: string) => void): () => void
}

/** The statements around one request: those sent before it was answered, and those after. */
export interface Counted {
  /** Sent between the request's start and the end of its answer (on the turn's path). */
  answered: string[]
  /** Sent once it was answered, until the server had sent nothing for the quiet time. */
  after: string[]
}

/** A statement's text, short and stable: no quotes, one space, the column list of a read elided. */
export function normalised(sql: string): string {
  return sql
    .replace(/"/g, '')
    .replace(/\s+/g, ' ')
    .trim()
    .replace(/^select (?!.*\bselect\b).+? from /i, 'select … from ')
    .replace(/\$\d+|\?/g, '?')
    .replace(/values (\(\?(, \?)*\))(, \1)+/i, 'values $1, …')
}

/**
 * What a server sends on its own, whatever its requests: the cluster leader's look at the nodes
 * once a second (every server on PostgreSQL leads its cluster, of one), and the webhook
 * deliverer's look at its outbox and at the tenants with deliveries due (a statement each, no transaction, when there
 * is nothing to send) and its purge of ended deliveries past their retention (a delete on its own
 * timer, which once fell inside a counted turn on CI: 9 > 8). Not counted.
 */
const BACKGROUND = [
  /^select … from nodes where state in /,
  /^select … from webhook_outbox /,
  /^select distinct tenant_id from webhook_deliveries /,
  /^update webhook_deliveries set claimed_until /,
  /^delete from webhook_deliveries where ended_at is not null /,
]

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/**
 * Runs `request` and collects the statements the server sends meanwhile, then those it goes on
 * sending after it (work that follows the answer) until none came for `quietMs`; at most
 * `settleMs` is waited.
 */
export async function countStatements(
  tap: Tap,
  request: () => Promise<void>,
  quietMs = 200,
  settleMs = 5000,
): Promise<Counted> {
  const counted: Counted = { answered: [], after: [] }
  let into = counted.answered
  let lastAt = performance.now()
  const stop = tap.listen((sql) => {
    const text = normalised(sql)
    if (BACKGROUND.some((background) => background.test(text))) return
    into.push(text)
    lastAt = performance.now()
  })
  try {
    await request()
    into = counted.after
    lastAt = performance.now()
    const deadline = lastAt + settleMs
    while (performance.now() - lastAt < quietMs && performance.now() < deadline) await sleep(quietMs / 4)
  } finally {
    stop()
  }
  return counted
}

/** Each statement with how often it came, in the order first sent. */
export function tally(statements: readonly string[]): Map<string, number> {
  const counts = new Map<string, number>()
  for (const sql of statements) counts.set(sql, (counts.get(sql) ?? 0) + 1)
  return counts
}
