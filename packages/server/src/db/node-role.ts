import type { Dialect } from './migrations/migration.js'

/** The PostgreSQL role every node's login role is a member of (docs/cluster.md, "The nodes' role"). */
export const NODE_ROLE = 'cairn_node'

/** The shared files a node may read (the egress CA its sandboxes trust); never the secrets key. */
export const NODE_SHARED_FILES_VIEW = 'node_shared_files'

/** `now + plus_ms` as the cluster's time text (what `dbTime` writes). */
const DB_TIME = (plusMs: string) =>
  `to_char((clock_timestamp() + (${plusMs}) * interval '1 millisecond') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`

/** The states in which a node holds a lease (`LEASED_STATES`). */
const LEASED = `('ready', 'cordoned', 'draining')`

/**
 * What a node may do in the cluster's database, and nothing more: the role `cairn_node` (made
 * here when missing), reads of the few columns a node reads, the egress CA through a view, and
 * its writes only through functions that run as the schema's owner and check who calls. A node is
 * its login role (`session_user`): its `nodes` row records the role that registered it, no other
 * node role may register, renew or stop that row, and a session's shipped snapshot is recorded
 * only by the role of the node that owns it, at the session's owner epoch, while that node is not
 * declared lost and its lease runs (or it stopped cleanly). Nothing else is granted: not the
 * secrets key, not a tenant's rows, no table a node could write directly.
 */
function nodeRoleSql(): string {
  const isNode = `${NODE_ROLE}_is_node_role`
  const mayAct = (holder: string) =>
    `(${holder} IS NULL OR ${holder} = session_user OR NOT ${isNode}(${holder}) OR NOT ${isNode}(session_user))`
  return `
DO $role$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '${NODE_ROLE}') THEN
    BEGIN
      CREATE ROLE ${NODE_ROLE} NOLOGIN;
    EXCEPTION
      WHEN duplicate_object OR unique_violation THEN NULL;
      WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'cairn needs the PostgreSQL role ${NODE_ROLE} (its nodes log in as its members), and % may not create roles: create it once as a superuser (CREATE ROLE ${NODE_ROLE} NOLOGIN) and start again', current_user
          USING ERRCODE = 'insufficient_privilege';
    END;
  END IF;
END
$role$;

CREATE FUNCTION ${isNode}(r TEXT) RETURNS BOOLEAN LANGUAGE sql STABLE AS $f$
  SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r AND NOT rolsuper AND pg_has_role(oid, '${NODE_ROLE}', 'MEMBER'))
$f$;

CREATE FUNCTION ${NODE_ROLE}_register(p_id TEXT, p_name TEXT, p_address TEXT, p_boot_id TEXT, p_drivers TEXT,
  p_cpus BIGINT, p_warm BIGINT, p_free BIGINT, p_size BIGINT, p_lease_ms BIGINT)
RETURNS TABLE (node_epoch BIGINT, node_state TEXT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $f$
BEGIN
  RETURN QUERY
  INSERT INTO nodes AS n (id, name, address, boot_id, state, drivers, cpus, warm_sandboxes, pool_free_bytes,
    pool_size_bytes, epoch, lease_expires_at, heartbeat_at, registered_at, lost_at, db_role)
  VALUES (p_id, p_name, p_address, p_boot_id, 'ready', p_drivers, p_cpus, p_warm, p_free, p_size, 1,
    ${DB_TIME('p_lease_ms')}, ${DB_TIME('0')}, ${DB_TIME('0')}, NULL, session_user)
  ON CONFLICT (id) DO UPDATE SET
    name = excluded.name, address = excluded.address, boot_id = excluded.boot_id,
    state = CASE WHEN n.state = 'cordoned' THEN n.state ELSE 'ready' END,
    drivers = excluded.drivers, cpus = excluded.cpus, warm_sandboxes = excluded.warm_sandboxes,
    pool_free_bytes = excluded.pool_free_bytes, pool_size_bytes = excluded.pool_size_bytes,
    epoch = n.epoch + 1, lease_expires_at = excluded.lease_expires_at, heartbeat_at = excluded.heartbeat_at,
    registered_at = excluded.registered_at, lost_at = NULL, db_role = session_user
  WHERE ${mayAct('n.db_role')}
  RETURNING n.epoch, n.state;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'node % is registered by another database role: each node logs in as its own role', p_id
      USING ERRCODE = 'insufficient_privilege';
  END IF;
END
$f$;

CREATE FUNCTION ${NODE_ROLE}_renew(p_id TEXT, p_epoch BIGINT, p_lease_ms BIGINT, p_warm BIGINT, p_free BIGINT)
RETURNS TEXT LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $f$
  UPDATE nodes SET lease_expires_at = ${DB_TIME('p_lease_ms')}, heartbeat_at = ${DB_TIME('0')},
    warm_sandboxes = p_warm, pool_free_bytes = p_free
  WHERE id = p_id AND epoch = p_epoch AND state IN ${LEASED} AND ${mayAct('db_role')}
  RETURNING state
$f$;

CREATE FUNCTION ${NODE_ROLE}_deregister(p_id TEXT, p_epoch BIGINT)
RETURNS BOOLEAN LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $f$
  WITH stopped AS (
    UPDATE nodes SET state = 'stopped', lease_expires_at = ${DB_TIME('0')}
    WHERE id = p_id AND epoch = p_epoch AND state IN ${LEASED} AND ${mayAct('db_role')}
    RETURNING id)
  SELECT EXISTS (SELECT 1 FROM stopped)
$f$;

CREATE FUNCTION ${NODE_ROLE}_record_shipped(p_session TEXT, p_owner_epoch BIGINT, p_generation BIGINT,
  p_snapshot TEXT, p_shipped_at TEXT, p_seq BIGINT, p_digest TEXT)
RETURNS BOOLEAN LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $f$
  WITH recorded AS (
    UPDATE sessions s SET shipped_generation = p_generation, shipped_snapshot_id = p_snapshot,
      shipped_at = p_shipped_at, shipped_link_seq = p_seq, shipped_tree_digest = p_digest
    WHERE s.id = p_session AND s.owner_epoch = p_owner_epoch
      AND (s.shipped_generation IS NULL OR s.shipped_generation <= p_generation)
      AND EXISTS (SELECT 1 FROM nodes n WHERE n.id = s.runtime_id AND n.db_role = session_user
        AND (n.state = 'stopped' OR (n.state IN ${LEASED} AND n.lease_expires_at > ${DB_TIME('0')})))
    RETURNING s.id)
  SELECT EXISTS (SELECT 1 FROM recorded)
$f$;

CREATE VIEW ${NODE_SHARED_FILES_VIEW} AS SELECT name, content FROM shared_files WHERE name = 'egress-ca';

REVOKE ALL ON FUNCTION ${isNode}(TEXT) FROM PUBLIC;
REVOKE ALL ON FUNCTION ${NODE_ROLE}_register(TEXT, TEXT, TEXT, TEXT, TEXT, BIGINT, BIGINT, BIGINT, BIGINT, BIGINT) FROM PUBLIC;
REVOKE ALL ON FUNCTION ${NODE_ROLE}_renew(TEXT, BIGINT, BIGINT, BIGINT, BIGINT) FROM PUBLIC;
REVOKE ALL ON FUNCTION ${NODE_ROLE}_deregister(TEXT, BIGINT) FROM PUBLIC;
REVOKE ALL ON FUNCTION ${NODE_ROLE}_record_shipped(TEXT, BIGINT, BIGINT, TEXT, TEXT, BIGINT, TEXT) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ${NODE_ROLE}_register(TEXT, TEXT, TEXT, TEXT, TEXT, BIGINT, BIGINT, BIGINT, BIGINT, BIGINT) TO ${NODE_ROLE};
GRANT EXECUTE ON FUNCTION ${NODE_ROLE}_renew(TEXT, BIGINT, BIGINT, BIGINT, BIGINT) TO ${NODE_ROLE};
GRANT EXECUTE ON FUNCTION ${NODE_ROLE}_deregister(TEXT, BIGINT) TO ${NODE_ROLE};
GRANT EXECUTE ON FUNCTION ${NODE_ROLE}_record_shipped(TEXT, BIGINT, BIGINT, TEXT, TEXT, BIGINT, TEXT) TO ${NODE_ROLE};
GRANT SELECT ON ${NODE_SHARED_FILES_VIEW} TO ${NODE_ROLE};
GRANT SELECT (version) ON schema_migrations TO ${NODE_ROLE};
GRANT SELECT (id, runtime_id, owner_epoch) ON sessions TO ${NODE_ROLE};
`
}

/** The migration's dialect part: PostgreSQL only (SQLite installs have no nodes). */
export function nodeRoleMigration(dialect: Dialect): string {
  return dialect === 'postgres' ? nodeRoleSql() : ''
}
