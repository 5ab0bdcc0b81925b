import { isIP } from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { canonicalCidr, type EgressLimits, HOST_IMAGE, hostDebianMirror } from '@cairn/runtime/port'
import type { Clock } from './clock.js'
import { type EgressLimitOptions, resolveEgressLimits } from './egress-limits.js'
import { type BodyBudgetLimits, bodyBudgetLimits } from './http/body-budget.js'
import {
  type OperatorLimitOptions,
  type OperatorLimits,
  resolveOperatorLimits,
} from './limits/operator-limits.js'
import { checkPreviewDomain, DEFAULT_PREVIEW_DOMAIN } from './previews/preview-origins.js'

/** Where Debian images come from when neither the operator nor this host's apt names a mirror. */
const DEFAULT_DEBIAN_MIRROR = 'http://deb.debian.org/debian'

export interface ServerOptions {
  dataDir?: string | undefined
  port?: number | undefined
  host?: string | undefined
  /** Workspace store: btrfs (default) or dir (copy-based, where btrfs is not possible). */
  storage?: 'btrfs' | 'dir' | undefined
  /** btrfs: an existing btrfs directory instead of a loop-mounted image; dir: where the trees live. */
  poolPath?: string | undefined
  poolImageSizeBytes?: number | undefined
  /**
   * The control plane's database: a `postgres://` URL (replicas share it), or unset for SQLite in
   * the data dir (`cairn.db`, the default). Env `CAIRN_DATABASE_URL`.
   */
  database?: string | undefined
  /**
   * `all` (default): API and runtime in one process. `api`: an API replica without a runtime of
   * its own, every session routed to its node (needs `database` and `clusterDir`). Env `CAIRN_ROLE`.
   */
  role?: ServerRole | undefined
  /** The cluster's certificates (`cairn cluster init`), for `role: 'api'`. Env `CAIRN_CLUSTER_DIR`. */
  clusterDir?: string | undefined
  logLevel?: string | undefined
  /** Largest accepted upload (deploy archive), in bytes. */
  maxUploadBytes?: number | undefined
  /**
   * Bytes of request bodies one tenant's requests may hold at once (`CAIRN_MAX_BODY_BYTES_PER_TENANT`;
   * default 256 MiB, at least the upload cap and a JSON body).
   */
  maxBodyBytesPerTenant?: number | undefined
  /** Bytes of request bodies the server holds at once (`CAIRN_MAX_BODY_BYTES`; default 1 GiB, at least a tenant's). */
  maxBodyBytes?: number | undefined
  /** Most entries an uploaded archive may hold. */
  maxArchiveFiles?: number | undefined
  /** Most bytes an uploaded archive may unpack to. */
  maxUnpackedBytes?: number | undefined
  /**
   * How often the sweep runs (retention; a safety net for timeouts). A session's idle timeout and
   * max duration fire when due, on a timer of their own.
   */
  reaperIntervalMs?: number | undefined
  /**
   * How long a paused session's memory checkpoint (`pause: memory`) is kept after it was taken;
   * retention deletes it then and the session's next message starts cold. Default 7 days; null
   * keeps them until the session's sandbox goes (an end, a delete, a workspace restore).
   */
  memoryCheckpointTtlMs?: number | null | undefined
  /**
   * The time the control plane records (session activity, keys, secrets, memory). Default: the
   * system clock. Tests set it back to make sessions whose last activity is in the past.
   */
  clock?: Clock | undefined
  /**
   * Size limit of each session workspace in MiB: what its /workspace references (btrfs qgroups;
   * default 4096 on btrfs, none on dir; 0 turns it off; env `CAIRN_WORKSPACE_QUOTA_MIB`).
   */
  workspaceQuotaMiB?: number | undefined
  /**
   * Limit in MiB of what one tenant's workspaces, snapshots and revisions hold together (exclusive
   * bytes: counted once where they share; default 10240 on btrfs, none on dir; 0 turns it off;
   * env `CAIRN_TENANT_QUOTA_MIB`).
   */
  tenantQuotaMiB?: number | undefined
  /**
   * MiB of the pool kept free for Cairn's own writes: agents' trees together may use the rest
   * (default 5% of the pool, 16 MiB to 2 GiB; env `CAIRN_POOL_RESERVE_MIB`).
   */
  poolReserveMiB?: number | undefined
  /**
   * MiB the shared agent images may hold together in the pool (their own quota group; default half
   * of what agents' trees may use, the pool less the reserve; env `CAIRN_IMAGES_QUOTA_MIB`): a
   * build or pull that would pass it is refused (`507 images_quota_exceeded`) or stopped.
   */
  imagesQuotaMiB?: number | undefined
  /** Private addresses sandboxes may reach through the egress proxy (internal services). */
  egressPrivateExceptions?: string[] | undefined
  /**
   * Address ranges (CIDR) webhooks may be sent to although the egress rule refuses them (loopback,
   * private ranges: a receiver inside your network). Env `CAIRN_WEBHOOK_ALLOW_CIDR=cidr,…`.
   */
  webhookAllowCidrs?: string[] | undefined
  /** Webhook timing (tests): the outbox's poll (default 1 s) and the first retry's wait (default 5 s). */
  webhookTiming?: { pollMs?: number; retryBaseMs?: number } | undefined
  /** Names the egress proxy resolves to these addresses before DNS (`CAIRN_EGRESS_HOSTS=name=addr,…`). */
  egressHosts?: Record<string, string> | undefined
  /** PEM file of extra CA certificates the egress proxy trusts upstream (internal hosts, tests). */
  egressUpstreamCaFile?: string | undefined
  /**
   * Bounds on each sandbox's egress: connections at once (`CAIRN_EGRESS_MAX_CONNECTIONS`, default
   * 128), idle time of a connection (`CAIRN_EGRESS_IDLE_TIMEOUT_MS`, 300000), name lookups at once
   * (`CAIRN_EGRESS_MAX_LOOKUPS`, 8) and their timeout (`CAIRN_EGRESS_LOOKUP_TIMEOUT_MS`, 5000),
   * and the DNS servers asked (`CAIRN_EGRESS_DNS_SERVERS=addr[:port],…`; default /etc/resolv.conf's).
   */
  egressLimits?: EgressLimitOptions | undefined
  /**
   * Hosts every revision build may reach through the egress proxy besides the agent's
   * `network.allow` (allowlist syntax: package registries). Unset: the registries npm and pip are
   * configured with on this host (`CAIRN_BUILD_EGRESS_ALLOW=host,host:port,…`; empty: none).
   */
  buildEgressAllow?: string[] | undefined
  /**
   * The image of agents whose cairn.yaml names none: `host` (the host's /usr, read-only: the
   * default, for a machine without a Debian mirror) or an image as cairn.yaml writes it
   * (`debian:bookworm`, an OCI reference). Env `CAIRN_DEFAULT_IMAGE`.
   */
  defaultImage?: string | undefined
  /** Debian mirror images are built from (default: the one this host's apt uses). Env `CAIRN_DEBIAN_MIRROR`. */
  debianMirror?: string | undefined
  /** Largest image root a build or pull may leave, in MiB (default 4096; env `CAIRN_MAX_IMAGE_MIB`). */
  maxImageMiB?: number | undefined
  /**
   * Distinct images (Debian recipes or OCI digests) one tenant's live revisions may run on
   * (default 8; env `CAIRN_MAX_IMAGES_PER_TENANT`): with `maxImageMiB`, what a tenant can make the
   * shared images take.
   */
  maxImagesPerTenant?: number | undefined
  /** Default sandbox driver for agents that do not choose one. */
  isolation?: 'bwrap' | 'gvisor' | undefined
  /** gVisor sandboxes kept booted ahead (default 2 when gVisor is the default). */
  gvisorPoolSize?: number | undefined
  /**
   * bwrap launchers kept ready in fresh cgroups for cold starts (default 2; 0 turns it off; env
   * `CAIRN_SPARE_LAUNCHERS`).
   */
  spareLaunchers?: number | undefined
  /**
   * Resident pauses: `pause: memory` sandboxes kept frozen in place at most (default 16; 0 turns
   * them off; env `CAIRN_RESIDENT_PAUSES`) and for how long each (default 10 min; env
   * `CAIRN_RESIDENT_PAUSE_MS`) before they are released (gVisor: checkpointed; bwrap: stopped).
   */
  residentPauses?: number | undefined
  residentPauseMs?: number | undefined
  /** How long a shutdown waits for running turns before cancelling them. */
  shutdownGraceMs?: number | undefined
  /** Requests per second per API key (twice as many as a burst); 0 disables the limit. */
  rateLimitPerSecond?: number | undefined
  /** Interval of the heartbeat events on SSE streams, in ms (default 15 s). */
  sseHeartbeatMs?: number | undefined
  /**
   * A client that reads nothing of a full SSE stream for this long is cut (default 60 s; env
   * `CAIRN_SSE_STALL_MS`); a turn's stream picks up again with `Last-Event-ID`.
   */
  sseStallMs?: number | undefined
  /** Write the admin key to the CLI credentials file when none exists (default true). */
  writeCredentials?: boolean | undefined
  /** Base directory for per-instance runtime files (default /run/cairn). */
  runBase?: string | undefined
  /**
   * Port of the preview listener, where each session port is served on its own origin (env
   * `CAIRN_PREVIEW_PORT`; default the API port + 1, or any free port when the API's is 0).
   */
  previewPort?: number | undefined
  /**
   * The domain whose subdomains `<port>-ses-<id>.<domain>` name previews (env
   * `CAIRN_PREVIEW_DOMAIN`; default `localhost`, which browsers resolve to loopback on their own).
   */
  previewDomain?: string | undefined
  /** The operator's maxima (limits a manifest may ask for, per-tenant counts); see limits/operator-limits.ts. */
  operatorLimits?: OperatorLimitOptions | undefined
  /**
   * Serve the hosted agent-session API's compatibility routes under this path prefix (e.g.
   * `/superserve`; env `CAIRN_COMPAT_PREFIX`); unset or empty: off. See docs/compat.md.
   */
  compatPrefix?: string | undefined
  /**
   * A cluster's liveness timing (PostgreSQL): nodes renew their lease every `heartbeatMs` (env
   * `CAIRN_HEARTBEAT_MS`, default 1000) for `leaseMs` (env `CAIRN_LEASE_MS`, default 5000); the
   * leader looks at the nodes every heartbeat.
   */
  heartbeatMs?: number | undefined
  leaseMs?: number | undefined
  /**
   * The shipping bucket (docs/shipping.md): a node ships its sessions' snapshots there (flags
   * `--s3-bucket`, `--s3-endpoint`, `--s3-prefix`; env `CAIRN_S3_BUCKET`, `CAIRN_S3_ENDPOINT`,
   * `CAIRN_S3_PREFIX`, `AWS_REGION`; credentials from the AWS SDK's chain). Unset: nothing ships.
   */
  s3Bucket?: string | undefined
  s3Endpoint?: string | undefined
  s3Prefix?: string | undefined
  /**
   * When a lost node's sessions come back on another node from the bucket: on their next message
   * (`on-message`, default) or as soon as the leader declares the node lost (`eager`); flag
   * `--recover-lost`, env `CAIRN_RECOVER_LOST`.
   */
  recoverLost?: RecoverLost | undefined
}

export type RecoverLost = 'on-message' | 'eager'

/** Where workspaces ship to (see `ServerOptions.s3Bucket`). */
export interface ShippingSettings {
  bucket: string
  endpoint: string | undefined
  prefix: string | undefined
  region: string | undefined
}

/** How long a memory checkpoint is kept by default (see ServerConfig.memoryCheckpointTtlMs). */
export const DEFAULT_MEMORY_CHECKPOINT_TTL_MS = 7 * 24 * 3600 * 1000

export interface ResolvedConfig {
  dataDir: string
  port: number
  host: string
  storage: 'btrfs' | 'dir'
  poolPath: string | undefined
  poolImageSizeBytes: number | undefined
  /** A `postgres://` URL, or undefined: SQLite in the data dir. */
  databaseUrl: string | undefined
  role: ServerRole
  clusterDir: string | undefined
  logLevel: string
  maxUploadBytes: number
  /** What request bodies may hold at once (see BodyBudget). */
  bodyBudget: BodyBudgetLimits
  maxArchiveFiles: number
  maxUnpackedBytes: number
  reaperIntervalMs: number
  memoryCheckpointTtlMs: number | null
  rateLimitPerSecond: number
  sseHeartbeatMs: number | undefined
  sseStallMs: number | undefined
  shutdownGraceMs: number
  isolation: 'bwrap' | 'gvisor'
  gvisorPoolSize: number | undefined
  spareLaunchers: number
  residentPauses: number | undefined
  residentPauseMs: number | undefined
  egressPrivateExceptions: string[]
  webhookAllowCidrs: string[]
  webhookTiming: { pollMs?: number; retryBaseMs?: number }
  egressHosts: ReadonlyMap<string, readonly string[]>
  egressUpstreamCaFile: string | undefined
  egressLimits: EgressLimits
  /** Undefined: found from the host's npm and pip configuration at the first build. */
  buildEgressAllow: string[] | undefined
  defaultImage: string
  debianMirror: string
  maxImageMiB: number
  maxImagesPerTenant: number
  workspaceQuotaMiB: number | undefined
  tenantQuotaMiB: number | undefined
  poolReserveMiB: number | undefined
  imagesQuotaMiB: number | undefined
  writeCredentials: boolean
  runBase: string | undefined
  previewPort: number
  previewDomain: string
  operatorLimits: OperatorLimits
  compatPrefix: string | undefined
  heartbeatMs: number
  leaseMs: number
  shipping: ShippingSettings | undefined
  recoverLost: RecoverLost
}

/** Each range in canonical form; one that is not a CIDR range is refused. */
function webhookAllowCidrs(cidrs: string[]): string[] {
  return cidrs.map((cidr) => {
    const canonical = canonicalCidr(cidr)
    if (!canonical)
      throw new CairnProblem(
        'validation_failed',
        `--webhook-allow-cidr: ${JSON.stringify(cidr)} is not a CIDR range (e.g. 10.0.0.0/8, 127.0.0.1/32, fd00::/8)`,
      )
    return canonical
  })
}

export function defaultDataDir(): string {
  return process.env.CAIRN_DATA_DIR ?? path.join(os.homedir(), '.cairn', 'data')
}

export const DEFAULT_PORT = 7070
export const DEFAULT_HOST = '127.0.0.1'
export const DEFAULT_MAX_UPLOAD_BYTES = 100 * 1024 * 1024
/** Storage quotas on by default where the driver can enforce them (btrfs). */
export const DEFAULT_WORKSPACE_QUOTA_MIB = 4096
export const DEFAULT_TENANT_QUOTA_MIB = 10240

/**
 * A quota in MiB: the option, else the environment variable, else the default of the storage
 * driver (none for dir, which cannot enforce one; an explicit value there is refused at start);
 * 0 means off.
 */
function quotaMiB(option: number | undefined, env: string | undefined, fallback: number | undefined) {
  const given = option ?? (env ? Number(env) : undefined)
  if (given !== undefined && (!Number.isFinite(given) || given < 0))
    throw new CairnProblem('validation_failed', `a quota must be a number of MiB (0: off), not '${given}'`)
  const value = given ?? fallback
  return value ? value : undefined
}

function maxImageMiB(value: number): number {
  if (!Number.isInteger(value) || value <= 0)
    throw new CairnProblem(
      'validation_failed',
      `the largest image must be a whole number of MiB, not '${value}'`,
    )
  return value
}

function maxImagesPerTenant(value: number): number {
  if (!Number.isInteger(value) || value <= 0)
    throw new CairnProblem(
      'validation_failed',
      `the distinct images per tenant must be a whole number above 0, not '${value}'`,
    )
  return value
}

export function resolveConfig(options: ServerOptions): ResolvedConfig {
  const envPort = process.env.CAIRN_PORT ? Number(process.env.CAIRN_PORT) : undefined
  const port = options.port ?? envPort ?? DEFAULT_PORT
  const envPreviewPort = process.env.CAIRN_PREVIEW_PORT ? Number(process.env.CAIRN_PREVIEW_PORT) : undefined
  const storage = options.storage ?? storageFromEnv(process.env.CAIRN_STORAGE)
  const btrfs = storage === 'btrfs'
  const maxUploadBytes =
    options.maxUploadBytes ??
    (process.env.CAIRN_MAX_UPLOAD_BYTES
      ? Number(process.env.CAIRN_MAX_UPLOAD_BYTES)
      : DEFAULT_MAX_UPLOAD_BYTES)
  const rateLimitPerSecond =
    options.rateLimitPerSecond ?? (process.env.CAIRN_RATE_LIMIT ? Number(process.env.CAIRN_RATE_LIMIT) : 1000)
  return {
    dataDir: path.resolve(options.dataDir ?? defaultDataDir()),
    port,
    previewPort: options.previewPort ?? envPreviewPort ?? (port === 0 || port >= 65535 ? 0 : port + 1),
    previewDomain: checkPreviewDomain(
      options.previewDomain ?? process.env.CAIRN_PREVIEW_DOMAIN ?? DEFAULT_PREVIEW_DOMAIN,
    ),
    host: options.host ?? process.env.CAIRN_HOST ?? DEFAULT_HOST,
    storage,
    poolPath: options.poolPath ?? process.env.CAIRN_POOL_PATH,
    poolImageSizeBytes: options.poolImageSizeBytes,
    databaseUrl: databaseUrl(options.database ?? process.env.CAIRN_DATABASE_URL),
    role: serverRole(options.role ?? process.env.CAIRN_ROLE),
    clusterDir: options.clusterDir ?? process.env.CAIRN_CLUSTER_DIR,
    logLevel: options.logLevel ?? process.env.CAIRN_LOG_LEVEL ?? 'info',
    maxUploadBytes,
    bodyBudget: bodyBudgetLimits(
      {
        perTenantBytes: options.maxBodyBytesPerTenant ?? envNumber('CAIRN_MAX_BODY_BYTES_PER_TENANT'),
        totalBytes: options.maxBodyBytes ?? envNumber('CAIRN_MAX_BODY_BYTES'),
      },
      maxUploadBytes,
    ),
    maxArchiveFiles: options.maxArchiveFiles ?? 50_000,
    maxUnpackedBytes: options.maxUnpackedBytes ?? 1024 * 1024 * 1024,
    reaperIntervalMs: options.reaperIntervalMs ?? 60_000,
    memoryCheckpointTtlMs:
      options.memoryCheckpointTtlMs === undefined
        ? DEFAULT_MEMORY_CHECKPOINT_TTL_MS
        : options.memoryCheckpointTtlMs,
    shutdownGraceMs: options.shutdownGraceMs ?? 10_000,
    sseHeartbeatMs: options.sseHeartbeatMs,
    sseStallMs:
      options.sseStallMs ??
      (process.env.CAIRN_SSE_STALL_MS ? Number(process.env.CAIRN_SSE_STALL_MS) : undefined),
    isolation: options.isolation ?? (process.env.CAIRN_ISOLATION === 'gvisor' ? 'gvisor' : 'bwrap'),
    gvisorPoolSize: options.gvisorPoolSize,
    spareLaunchers: options.spareLaunchers ?? Number(process.env.CAIRN_SPARE_LAUNCHERS ?? 2),
    residentPauses: options.residentPauses,
    residentPauseMs: options.residentPauseMs,
    egressPrivateExceptions:
      options.egressPrivateExceptions ??
      process.env.CAIRN_EGRESS_ALLOW_PRIVATE?.split(',').filter(Boolean) ??
      [],
    webhookAllowCidrs: webhookAllowCidrs(
      options.webhookAllowCidrs ?? process.env.CAIRN_WEBHOOK_ALLOW_CIDR?.split(',').filter(Boolean) ?? [],
    ),
    webhookTiming: options.webhookTiming ?? {},
    egressHosts: egressHostMap(options.egressHosts ?? process.env.CAIRN_EGRESS_HOSTS),
    egressUpstreamCaFile: options.egressUpstreamCaFile ?? process.env.CAIRN_EGRESS_UPSTREAM_CA,
    egressLimits: resolveEgressLimits(options.egressLimits),
    buildEgressAllow:
      options.buildEgressAllow ??
      process.env.CAIRN_BUILD_EGRESS_ALLOW?.split(',')
        .map((host) => host.trim())
        .filter(Boolean),
    defaultImage: options.defaultImage ?? process.env.CAIRN_DEFAULT_IMAGE ?? HOST_IMAGE,
    debianMirror:
      options.debianMirror ?? process.env.CAIRN_DEBIAN_MIRROR ?? hostDebianMirror() ?? DEFAULT_DEBIAN_MIRROR,
    maxImageMiB: maxImageMiB(options.maxImageMiB ?? Number(process.env.CAIRN_MAX_IMAGE_MIB ?? 4096)),
    maxImagesPerTenant: maxImagesPerTenant(
      options.maxImagesPerTenant ?? Number(process.env.CAIRN_MAX_IMAGES_PER_TENANT ?? 8),
    ),
    workspaceQuotaMiB: quotaMiB(
      options.workspaceQuotaMiB,
      process.env.CAIRN_WORKSPACE_QUOTA_MIB,
      btrfs ? DEFAULT_WORKSPACE_QUOTA_MIB : undefined,
    ),
    tenantQuotaMiB: quotaMiB(
      options.tenantQuotaMiB,
      process.env.CAIRN_TENANT_QUOTA_MIB,
      btrfs ? DEFAULT_TENANT_QUOTA_MIB : undefined,
    ),
    poolReserveMiB: quotaMiB(options.poolReserveMiB, process.env.CAIRN_POOL_RESERVE_MIB, undefined),
    imagesQuotaMiB: quotaMiB(options.imagesQuotaMiB, process.env.CAIRN_IMAGES_QUOTA_MIB, undefined),
    rateLimitPerSecond,
    writeCredentials: options.writeCredentials ?? true,
    runBase: options.runBase,
    operatorLimits: resolveOperatorLimits(options.operatorLimits, rateLimitPerSecond),
    compatPrefix: checkCompatPrefix(options.compatPrefix ?? process.env.CAIRN_COMPAT_PREFIX),
    ...clusterTiming(options),
    shipping: shippingSettings(options),
    recoverLost: recoverLost(options.recoverLost ?? process.env.CAIRN_RECOVER_LOST),
  }
}

function envNumber(name: string): number | undefined {
  const raw = process.env[name]
  return raw ? Number(raw) : undefined
}

function shippingSettings(options: ServerOptions): ShippingSettings | undefined {
  const bucket = (options.s3Bucket ?? process.env.CAIRN_S3_BUCKET)?.trim()
  if (!bucket) return undefined
  const text = (value: string | undefined) => value?.trim() || undefined
  return {
    bucket,
    endpoint: text(options.s3Endpoint ?? process.env.CAIRN_S3_ENDPOINT),
    prefix: text(options.s3Prefix ?? process.env.CAIRN_S3_PREFIX),
    region: text(process.env.AWS_REGION),
  }
}

function recoverLost(value: string | undefined): RecoverLost {
  if (value === undefined || value === '' || value === 'on-message') return 'on-message'
  if (value === 'eager') return 'eager'
  throw new CairnProblem(
    'validation_failed',
    `--recover-lost (CAIRN_RECOVER_LOST) must be eager or on-message, not '${value}'`,
    { option: 'recover-lost' },
  )
}

/** The lease must outlast two heartbeats, so one lost heartbeat never ends it. */
function clusterTiming(options: ServerOptions): { heartbeatMs: number; leaseMs: number } {
  const number = (value: number | undefined, env: string | undefined, fallback: number, name: string) => {
    const n = value ?? (env === undefined || env === '' ? fallback : Number(env))
    if (!Number.isInteger(n) || n < 10)
      throw new CairnProblem(
        'validation_failed',
        `${name} must be a whole number of milliseconds ≥ 10, not '${n}'`,
      )
    return n
  }
  const heartbeatMs = number(
    options.heartbeatMs,
    process.env.CAIRN_HEARTBEAT_MS,
    1000,
    '--heartbeat-ms (CAIRN_HEARTBEAT_MS)',
  )
  const leaseMs = number(options.leaseMs, process.env.CAIRN_LEASE_MS, 5000, '--lease-ms (CAIRN_LEASE_MS)')
  if (leaseMs < 2 * heartbeatMs)
    throw new CairnProblem(
      'validation_failed',
      `--lease-ms (${leaseMs}) must be at least two heartbeats (--heartbeat-ms ${heartbeatMs}) long`,
    )
  return { heartbeatMs, leaseMs }
}

/** `/name[/name…]`: a path prefix of plain segments, never `/v1` (Cairn's own API) or the root. */
export function checkCompatPrefix(value: string | undefined): string | undefined {
  if (value === undefined || value === '') return undefined
  const prefix = value.replace(/\/+$/, '')
  const segments = prefix.split('/').slice(1)
  if (
    !/^(\/[A-Za-z0-9._-]+)+$/.test(prefix) ||
    segments.some((segment) => segment === '.' || segment === '..') ||
    segments[0] === 'v1'
  ) {
    throw new CairnProblem(
      'validation_failed',
      `CAIRN_COMPAT_PREFIX (--compat-prefix) must be a path like /superserve, not '${value}'`,
    )
  }
  return prefix
}

function storageFromEnv(value: string | undefined): 'btrfs' | 'dir' {
  if (value === undefined || value === '' || value === 'btrfs') return 'btrfs'
  if (value === 'dir') return 'dir'
  throw new CairnProblem('validation_failed', `CAIRN_STORAGE must be btrfs or dir, not '${value}'`)
}

/**
 * `name=address[,name=address…]` (or an object) as the egress proxy's own hosts map; a name given
 * twice resolves to each of its addresses. An entry without a valid address is a start-up error.
 */
export function egressHostMap(
  given: Record<string, string> | string | undefined,
): ReadonlyMap<string, readonly string[]> {
  const pairs =
    typeof given === 'string'
      ? given
          .split(',')
          .map((entry) => entry.trim())
          .filter(Boolean)
          .map((entry) => {
            const at = entry.indexOf('=')
            // No '=' at all is no name (not the entry less its last character).
            return at < 0 ? (['', entry] as const) : ([entry.slice(0, at), entry.slice(at + 1)] as const)
          })
      : Object.entries(given ?? {})
  const map = new Map<string, string[]>()
  for (const [name, address] of pairs) {
    if (name === '' || isIP(address) === 0)
      throw new Error(`CAIRN_EGRESS_HOSTS: '${name}=${address}' is not name=IP-address`)
    const key = name.toLowerCase()
    map.set(key, [...(map.get(key) ?? []), address])
  }
  return map
}

/** What a server process runs: both API and runtime (`all`), or the API only (`api`). */
export type ServerRole = 'all' | 'api'

function serverRole(value: string | undefined): ServerRole {
  if (value === undefined || value === '' || value === 'all') return 'all'
  if (value === 'api') return 'api'
  throw new CairnProblem('validation_failed', `--role (CAIRN_ROLE) must be 'all' or 'api', not '${value}'`)
}

/** A database given must be a PostgreSQL URL (SQLite needs none: it lives in the data dir). */
function databaseUrl(value: string | undefined): string | undefined {
  if (value === undefined || value === '') return undefined
  if (!/^postgres(ql)?:\/\//.test(value))
    throw new CairnProblem(
      'validation_failed',
      `--database (CAIRN_DATABASE_URL) must be a postgres:// URL, not '${value.replace(/:[^:@/]*@/, ':***@')}'; leave it unset for SQLite in the data dir`,
    )
  return value
}
