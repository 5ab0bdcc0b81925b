import type { Dialect } from './migrations/migration.js'

/**
 * Ended commands whose logs a node keeps per session (`KEPT_ENDED_COMMANDS` in
 * @cairn/protocol when this migration was written; a change there needs a new migration).
 */
const KEPT_ENDED = 16

/**
 * Migration 36's counters: `tenant_storage` holds, per tenant, the bytes Cairn keeps for it
 * beside the pool (artifacts, command logs, turn events, turns' prompts, responses and stderr),
 * kept by triggers in the statement that writes or deletes each row, wherever in the code that
 * is (a turn's end, retention, a fork's copy). So the budget's check reads one row, however many
 * rows the tenant or the install holds.
 *
 * A session's command logs count a window of its commands (its running ones at their bound, its
 * last `KEPT_ENDED` ended ones at the bytes they kept; none once it is deleted): each write to a
 * session's commands recomputes that session's sum (`session_command_logs`, bounded by the
 * session's commands) and adds the difference. On PostgreSQL the trigger takes the tenant's row
 * lock first, so the recomputation (a fresh snapshot per statement) sees every committed write
 * before it and the sums stay exact under concurrent writers; every trigger locks that one row
 * only, and always first, so no two of them wait on each other in opposite orders.
 * Part of a released migration: never edit; add a new migration instead.
 */
export function storageTriggers(dialect: Dialect): string {
  return [...SOURCES.map((source) => trigger(dialect, source)), backfill(dialect)].join('\n')
}

interface Source {
  name: string
  /** `INSERT ON table`, `DELETE ON table` or `UPDATE OF columns ON table`. */
  on: string
  /** When the row counts (PostgreSQL and SQLite spell it the same). */
  when?: string
  /** The statements, over `NEW`/`OLD`. */
  body: (dialect: Dialect) => string[]
}

/** Bytes of a text value as stored (UTF-8). */
function octets(dialect: Dialect, expr: string): string {
  return dialect === 'postgres' ? `octet_length(${expr})` : `length(CAST(${expr} AS BLOB))`
}

/** Adds `delta` to the tenant's `column` (the row made at the tenant's first byte). */
function bump(column: string, tenant: string, delta: string, [from, where] = ['', 'true']): string {
  return `INSERT INTO tenant_storage (tenant_id, ${column}) SELECT ${tenant}, ${delta}${from} WHERE ${where}
    ON CONFLICT (tenant_id) DO UPDATE SET ${column} = tenant_storage.${column} + excluded.${column};`
}

/** The tenant of a turn event's row (`s.tenant_id`): its turn's session. */
const turnTenant = (row: 'NEW' | 'OLD'): [string, string] => [
  ' FROM turns t JOIN sessions s ON s.id = t.session_id',
  `t.id = ${row}.turn_id`,
]
/** The tenant of a turn's row (`s.tenant_id`): its session. */
const sessionTenant = (row: 'NEW' | 'OLD'): [string, string] => [
  ' FROM sessions s',
  `s.id = ${row}.session_id`,
]
const turnText = (dialect: Dialect, row: string) =>
  `(${octets(dialect, `${row}.prompt`)} + ${octets(dialect, `${row}.response`)} + ${octets(dialect, `${row}.stderr`)})`

/** The bytes a session's command logs hold on their node (see `commandLogUsage`). */
function sessionCommandLogBytes(session: string): string {
  return `(SELECT COALESCE(SUM(CASE WHEN k.status = 'running' THEN k.max_output_bytes ELSE k.output_bytes - k.kept_from_offset END), 0)
    FROM (
      SELECT c.status, c.max_output_bytes, c.output_bytes, c.kept_from_offset,
        ROW_NUMBER() OVER (PARTITION BY c.status ORDER BY c.started_at DESC, c.id DESC) AS n
      FROM commands c JOIN sessions cs ON cs.id = c.session_id
      WHERE c.session_id = ${session} AND c.status <> 'lost' AND cs.status <> 'deleted'
    ) k
    WHERE k.status = 'running' OR k.n <= ${KEPT_ENDED})`
}

/** Recomputes the session's command-log sum and adds its change to the tenant's. */
function recountSession(dialect: Dialect, session: string, tenant: string): string[] {
  return [
    `INSERT INTO tenant_storage (tenant_id) SELECT ${tenant} WHERE true ON CONFLICT (tenant_id) DO NOTHING;`,
    ...(dialect === 'postgres'
      ? [`PERFORM 1 FROM tenant_storage WHERE tenant_id = ${tenant} FOR UPDATE;`]
      : []),
    `INSERT INTO session_command_logs (session_id, tenant_id, bytes) SELECT ${session}, ${tenant}, 0 WHERE true
      ON CONFLICT (session_id) DO NOTHING;`,
    `UPDATE tenant_storage SET command_log_bytes = command_log_bytes + ${sessionCommandLogBytes(session)}
      - (SELECT l.bytes FROM session_command_logs l WHERE l.session_id = ${session})
      WHERE tenant_id = ${tenant};`,
    `UPDATE session_command_logs SET bytes = ${sessionCommandLogBytes(session)} WHERE session_id = ${session};`,
  ]
}

const SOURCES: Source[] = [
  {
    name: 'storage_turn_event_written',
    on: 'INSERT ON turn_events',
    body: (d) => [bump('turn_event_bytes', 's.tenant_id', octets(d, 'NEW.event'), turnTenant('NEW'))],
  },
  {
    name: 'storage_turn_event_deleted',
    on: 'DELETE ON turn_events',
    body: (d) => [bump('turn_event_bytes', 's.tenant_id', `-${octets(d, 'OLD.event')}`, turnTenant('OLD'))],
  },
  {
    name: 'storage_turn_written',
    on: 'INSERT ON turns',
    body: (d) => [bump('turn_text_bytes', 's.tenant_id', turnText(d, 'NEW'), sessionTenant('NEW'))],
  },
  {
    name: 'storage_turn_updated',
    on: 'UPDATE OF prompt, response, stderr ON turns',
    when: 'NEW.prompt <> OLD.prompt OR NEW.response <> OLD.response OR NEW.stderr <> OLD.stderr',
    body: (d) => [
      bump(
        'turn_text_bytes',
        's.tenant_id',
        `${turnText(d, 'NEW')} - ${turnText(d, 'OLD')}`,
        sessionTenant('NEW'),
      ),
    ],
  },
  {
    name: 'storage_turn_deleted',
    on: 'DELETE ON turns',
    body: (d) => [bump('turn_text_bytes', 's.tenant_id', `-${turnText(d, 'OLD')}`, sessionTenant('OLD'))],
  },
  {
    name: 'storage_artifact_written',
    on: 'INSERT ON artifacts',
    body: () => [bump('artifact_bytes', 'NEW.tenant_id', 'NEW.size_bytes')],
  },
  {
    name: 'storage_artifact_deleted',
    on: 'DELETE ON artifacts',
    body: () => [bump('artifact_bytes', 'OLD.tenant_id', '-OLD.size_bytes')],
  },
  {
    name: 'storage_command_written',
    on: 'INSERT ON commands',
    body: (d) => recountSession(d, 'NEW.session_id', 'NEW.tenant_id'),
  },
  {
    name: 'storage_command_updated',
    on: 'UPDATE ON commands',
    body: (d) => recountSession(d, 'NEW.session_id', 'NEW.tenant_id'),
  },
  {
    name: 'storage_command_deleted',
    on: 'DELETE ON commands',
    body: (d) => recountSession(d, 'OLD.session_id', 'OLD.tenant_id'),
  },
  {
    name: 'storage_session_deleted',
    on: 'UPDATE OF status ON sessions',
    when: "(NEW.status = 'deleted') <> (OLD.status = 'deleted')",
    body: (d) => recountSession(d, 'NEW.id', 'NEW.tenant_id'),
  },
]

function trigger(dialect: Dialect, source: Source): string {
  const [event, table] = source.on.split(' ON ') as [string, string]
  const body = source.body(dialect).join('\n  ')
  if (dialect === 'sqlite')
    return `CREATE TRIGGER ${source.name} AFTER ${source.on} FOR EACH ROW${source.when ? ` WHEN ${source.when}` : ''}
BEGIN
  ${body}
END;`
  return `CREATE FUNCTION ${source.name}() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
  ${body}
  RETURN NULL;
END
$body$;
CREATE TRIGGER ${source.name} AFTER ${event} ON ${table} FOR EACH ROW${source.when ? ` WHEN (${source.when})` : ''} EXECUTE FUNCTION ${source.name}();`
}

/** The counters of what the install already holds (run once, in the migration's transaction). */
function backfill(dialect: Dialect): string {
  const sum = (expr: string, from: string) => `COALESCE((SELECT SUM(${expr}) ${from}), 0)`
  return `
INSERT INTO session_command_logs (session_id, tenant_id, bytes)
  SELECT s.id, s.tenant_id, ${sessionCommandLogBytes('s.id')} FROM sessions s
  WHERE EXISTS (SELECT 1 FROM commands c WHERE c.session_id = s.id);
INSERT INTO tenant_storage (tenant_id)
  SELECT tenant_id FROM sessions UNION SELECT tenant_id FROM artifacts UNION SELECT tenant_id FROM commands;
UPDATE tenant_storage SET
  artifact_bytes = ${sum('a.size_bytes', 'FROM artifacts a WHERE a.tenant_id = tenant_storage.tenant_id')},
  command_log_bytes = ${sum('l.bytes', 'FROM session_command_logs l WHERE l.tenant_id = tenant_storage.tenant_id')},
  turn_event_bytes = ${sum(
    octets(dialect, 'e.event'),
    'FROM turn_events e JOIN turns t ON t.id = e.turn_id JOIN sessions s ON s.id = t.session_id WHERE s.tenant_id = tenant_storage.tenant_id',
  )},
  turn_text_bytes = ${sum(
    turnText(dialect, 't'),
    'FROM turns t JOIN sessions s ON s.id = t.session_id WHERE s.tenant_id = tenant_storage.tenant_id',
  )};`
}
