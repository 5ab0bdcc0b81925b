import { mkdir } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { loadClusterTls, RemoteRuntimePort } from '@cairn/runtime/port'
import { iso } from './clock.js'
import type { NodeConnector } from './cluster/routing/cluster-runtime-host.js'
import type { RecoveryFaultAt } from './cluster/routing/cluster-runtime-port-options.js'
import type { ResolvedConfig } from './config.js'
import { secureDataDir } from './data-dir.js'
import type { Db } from './db/database.js'
import { SharedFiles } from './db/shared-files.js'
import type { ClaimedDataDir } from './local-runtime.js'
import { SecretCipher } from './secrets/cipher.js'

/**
 * What a server started with `--role api` (a replica of a cluster's control plane, no sandboxes
 * of its own) needs beside a single server: its checks, its data dir, the secrets key every
 * replica shares, and the way it reaches the nodes.
 */

/** What only tests and embedders set: how an API replica reaches its nodes. */
export interface StartServerExtras {
  /**
   * `role: 'api'`: makes the port of a node from its `nodes` row (default: the remote runtime
   * port over mutual TLS with the cluster dir's certificates).
   */
  connectNode?: NodeConnector | undefined
  /**
   * `role: 'api'`: how long a session's node and epoch (and the nodes' rows) are reused once read
   * (default 1 s); a test lengthens it to hold a route another replica made stale.
   */
  routeCacheMs?: number | undefined
  /** `role: 'api'`: fault injection into node-loss recovery (`NodeLossRecoveryDeps.faultAt`). */
  recoveryFaultAt?: RecoveryFaultAt | undefined
}

/** The typed refusal of a `role: 'api'` start that lacks what it needs. */
export function checkApiRole(config: ResolvedConfig, extras: StartServerExtras): void {
  if (!config.databaseUrl)
    throw new CairnProblem(
      'validation_failed',
      '--role api needs --database postgres://… (CAIRN_DATABASE_URL): the nodes and the sessions they hold are there',
    )
  if (!config.clusterDir && !extras.connectNode)
    throw new CairnProblem(
      'validation_failed',
      '--role api needs --cluster-dir (CAIRN_CLUSTER_DIR), the certificates `cairn cluster init` wrote, to reach the nodes',
    )
}

/**
 * An API replica's data dir: no pool, so nothing in it is its alone (no lock); owner-only, as it
 * holds the secrets key and the admin key.
 */
export async function apiDataDir(config: ResolvedConfig): Promise<ClaimedDataDir> {
  await mkdir(config.dataDir, { recursive: true, mode: 0o700 })
  await secureDataDir(config.dataDir, [])
  return { poolTrees: [], releaseLocks: async () => {} }
}

/** The secrets key every replica shares (the first replica's, kept in the database). */
export async function syncSecretKey(db: Db, dataDirPath: string, clock: { now(): number }): Promise<void> {
  if (process.env.CAIRN_SECRET_KEY) return
  await new SharedFiles(db, () => iso(clock.now())).sync(
    'secret.key',
    dataDirPath,
    ['secret.key'],
    async () => {
      await SecretCipher.load(path.join(dataDirPath, 'secret.key'))
    },
  )
}

/**
 * The nodes' ports over the network: HTTP/2 with mutual TLS, this replica presenting the cluster
 * dir's `api` certificate and accepting only the CA's `node` certificates.
 */
export async function remoteNodeConnector(config: ResolvedConfig): Promise<NodeConnector> {
  if (!config.clusterDir) throw new CairnProblem('validation_failed', '--role api needs --cluster-dir')
  const tls = await loadClusterTls(config.clusterDir, 'api')
  return (row, events) => new RemoteRuntimePort({ url: row.address, tls, events })
}
