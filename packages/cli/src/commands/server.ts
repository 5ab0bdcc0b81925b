import { jsonOption, positiveInt, positiveIntOrZero, positiveNumber, type Register } from '../command.js'
import { UsageError } from '../errors.js'
import { explainHostRefusal } from '../host-refusal.js'
import { closeOnSignal, listenForStop } from './until-signal.js'

interface ServerOptions {
  dataDir?: string
  port?: number
  host?: string
  poolPath?: string
  database?: string
  role?: string
  clusterDir?: string
  s3Bucket?: string
  s3Endpoint?: string
  s3Prefix?: string
  recoverLost?: string
  storage?: string
  logLevel?: string
  workspaceQuotaMib?: number
  tenantQuotaMib?: number
  poolReserveMib?: number
  imagesQuotaMib?: number
  egressAllowPrivate?: string
  webhookAllowCidr?: string
  buildEgressAllow?: string
  defaultImage?: string
  debianMirror?: string
  maxImageMib?: number
  maxImagesPerTenant?: number
  isolation?: 'bwrap' | 'gvisor'
  previewPort?: number
  previewDomain?: string
  maxMemoryMib?: number
  maxPids?: number
  maxCpus?: number
  maxTurnTimeoutMs?: number
  maxSetupTimeoutMs?: number
  maxSandboxesPerTenant?: number
  sandboxWaitMs?: number
  maxBuildsPerTenant?: number
  maxSnapshotsPerSession?: number
  maxSnapshotsPerTenant?: number
  maxKeysPerTenant?: number
  tenantRateLimit?: number
  maxConnections?: number
  maxConnectionsPerPeer?: number
  headersTimeoutMs?: number
  idleTimeoutMs?: number
  requestTimeoutMs?: number
  compatPrefix?: string
}

/** The operator's maxima as flags (each also an environment variable; see `GET /v1/runtime`). */
const OPERATOR_LIMIT_FLAGS = [
  [
    '--max-memory-mib <mib>',
    'most memory an agent may ask for (env CAIRN_MAX_MEMORY_MIB; default 4096)',
    positiveInt,
  ],
  ['--max-pids <n>', 'most processes an agent may ask for (env CAIRN_MAX_PIDS; default 4096)', positiveInt],
  [
    '--max-cpus <n>',
    "most CPUs an agent may ask for (env CAIRN_MAX_CPUS; default this host's)",
    positiveNumber,
  ],
  [
    '--max-turn-timeout-ms <ms>',
    'longest turn timeout an agent may ask for (env CAIRN_MAX_TURN_TIMEOUT_MS; default 1 h)',
    positiveInt,
  ],
  [
    '--max-setup-timeout-ms <ms>',
    'longest setup phase timeout (env CAIRN_MAX_SETUP_TIMEOUT_MS; default 1 h)',
    positiveInt,
  ],
  [
    '--max-sandboxes-per-tenant <n>',
    'agent sandboxes one tenant may run at once (env CAIRN_MAX_SANDBOXES_PER_TENANT; default 64)',
    positiveInt,
  ],
  [
    '--sandbox-wait-ms <ms>',
    "how long a message waits for one of its tenant's sandboxes when all run turns, before 429 sandbox_limit_reached; 0 refuses at once (env CAIRN_SANDBOX_WAIT_MS; default 60 s)",
    positiveIntOrZero,
  ],
  [
    '--max-builds-per-tenant <n>',
    'builds (dependencies, setup) one tenant may run at once (env CAIRN_MAX_BUILDS_PER_TENANT; default 4)',
    positiveInt,
  ],
  [
    '--max-snapshots-per-session <n>',
    'manual snapshots one session may keep (env CAIRN_MAX_SNAPSHOTS_PER_SESSION; default 100)',
    positiveInt,
  ],
  [
    '--max-snapshots-per-tenant <n>',
    'manual snapshots one tenant may keep (env CAIRN_MAX_SNAPSHOTS_PER_TENANT; default 1000)',
    positiveInt,
  ],
  [
    '--max-keys-per-tenant <n>',
    'active API keys one tenant may hold (env CAIRN_MAX_KEYS_PER_TENANT; default 20)',
    positiveInt,
  ],
  [
    '--tenant-rate-limit <n>',
    "requests per second of all of a tenant's keys together (env CAIRN_TENANT_RATE_LIMIT; default the per-key rate)",
    positiveNumber,
  ],
  [
    '--max-connections <n>',
    "connections the API and preview listeners may hold together (env CAIRN_MAX_CONNECTIONS; default and ceiling: the descriptor limit less the runtime's reserve, a quarter of it)",
    positiveInt,
  ],
  [
    '--max-connections-per-peer <n>',
    'connections one peer (an IPv4 address, an IPv6 /64) may hold (env CAIRN_MAX_CONNECTIONS_PER_PEER; default 512)',
    positiveInt,
  ],
  [
    '--headers-timeout-ms <ms>',
    "time a connection has to send a request's headers (env CAIRN_HEADERS_TIMEOUT_MS; default 10 s)",
    positiveInt,
  ],
  [
    '--idle-timeout-ms <ms>',
    'time an idle keep-alive connection is kept (env CAIRN_IDLE_TIMEOUT_MS; default 72 s)',
    positiveInt,
  ],
  [
    '--request-timeout-ms <ms>',
    'time a request has to arrive whole, its body included; 408 past it (env CAIRN_REQUEST_TIMEOUT_MS; default 10 min)',
    positiveInt,
  ],
] as const

export const register: Register = (parent, ctx) => {
  const command = jsonOption(
    parent
      .command('server')
      .description('Run the control plane and the runtime on this machine until Ctrl-C')
      .option(
        '--data-dir <dir>',
        'where the database, pool image and admin key live (env CAIRN_DATA_DIR; default ~/.cairn/data)',
      )
      .option(
        '--port <port>',
        'port to listen on, 0 for any (env CAIRN_PORT; default 7070)',
        positiveIntOrZero,
      )
      .option('--host <host>', 'address to listen on (default 127.0.0.1)')
      .option(
        '--preview-port <port>',
        'port of the preview listener, where each session port is served on its own origin (env CAIRN_PREVIEW_PORT; default --port + 1, any when --port is 0)',
        positiveIntOrZero,
      )
      .option(
        '--preview-domain <domain>',
        'previews are served at <port>-ses-<id>.<domain>; needs a wildcard DNS record to the preview listener unless it is localhost (env CAIRN_PREVIEW_DOMAIN; default localhost)',
      )
      .option(
        '--storage <driver>',
        'workspace store: btrfs (default; O(1) snapshots, quotas) or dir (plain directories, copies grow with the file count) (env CAIRN_STORAGE)',
      )
      .option(
        '--pool-path <dir>',
        'btrfs: an existing btrfs directory to use as the pool; dir: where the trees live (default <data-dir>/pool)',
      )
      .option(
        '--database <url>',
        "the control plane's database: a postgres:// URL (several API replicas can share it); default SQLite in the data dir (env CAIRN_DATABASE_URL)",
      )
      .option(
        '--role <role>',
        'all (default): API and runtime in this process; api: an API replica without a runtime, every session routed to its node (needs --database and --cluster-dir) (env CAIRN_ROLE)',
      )
      .option(
        '--cluster-dir <dir>',
        'with --role api: the certificates `cairn cluster init` wrote, to reach the nodes (env CAIRN_CLUSTER_DIR)',
      )
      .option(
        '--s3-bucket <name>',
        "the shipping bucket: each session's snapshots are shipped there so another node can restore them (env CAIRN_S3_BUCKET; default: nothing ships; credentials AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, region AWS_REGION)",
      )
      .option(
        '--s3-endpoint <url>',
        'an S3-compatible endpoint for the bucket (Ceph RGW, MinIO; env CAIRN_S3_ENDPOINT; default AWS S3)',
      )
      .option(
        '--s3-prefix <prefix>',
        'prepended to every key in the bucket, ending in / (env CAIRN_S3_PREFIX)',
      )
      .option(
        '--recover-lost <when>',
        "when a lost node's sessions are restored on another node from the bucket: on-message (default: at their next message) or eager (as soon as the node is declared lost) (env CAIRN_RECOVER_LOST)",
      )
      .option(
        '--compat-prefix <path>',
        "also serve the hosted agent-session API its own SDK and CLI speak, under this path (e.g. /superserve; their base URL is this server's URL plus it; env CAIRN_COMPAT_PREFIX; default off; see docs/compat.md)",
      )
      .option('--log-level <level>', 'log level: fatal, error, warn, info, debug, trace')
      .option(
        '--workspace-quota-mib <mib>',
        'size limit of each session workspace, in MiB (btrfs qgroups; 0: off; env CAIRN_WORKSPACE_QUOTA_MIB; default 4096 on btrfs)',
        positiveIntOrZero,
      )
      .option(
        '--tenant-quota-mib <mib>',
        "limit of what one tenant's workspaces, snapshots and revisions hold together, in MiB (0: off; env CAIRN_TENANT_QUOTA_MIB; default 10240 on btrfs)",
        positiveIntOrZero,
      )
      .option(
        '--pool-reserve-mib <mib>',
        "pool space kept free for Cairn's own writes, in MiB (env CAIRN_POOL_RESERVE_MIB; default 5% of the pool, 16 MiB to 2 GiB)",
        positiveIntOrZero,
      )
      .option(
        '--images-quota-mib <mib>',
        "what the shared agent images may hold together in the pool, in MiB (env CAIRN_IMAGES_QUOTA_MIB; default half of what agents' trees may use)",
        positiveIntOrZero,
      )
      .option(
        '--isolation <driver>',
        'default sandbox driver: bwrap (default) or gvisor (env CAIRN_ISOLATION)',
      )
      .option(
        '--egress-allow-private <addresses>',
        'comma-separated private addresses sandboxes may reach through the egress proxy',
      )
      .option(
        '--webhook-allow-cidr <ranges>',
        "comma-separated CIDR ranges webhooks may be sent to although private or loopback (env CAIRN_WEBHOOK_ALLOW_CIDR; the server's own listeners stay refused)",
      )
      .option(
        '--build-egress-allow <hosts>',
        "comma-separated hosts every revision build may reach besides the agent's network.allow (env CAIRN_BUILD_EGRESS_ALLOW; default: the registries npm and pip are configured with; '' for none)",
      )
      .option(
        '--default-image <image>',
        "image of agents whose cairn.yaml names none: host (the host's /usr, read-only; default), debian:<suite> or an OCI reference (env CAIRN_DEFAULT_IMAGE)",
      )
      .option(
        '--debian-mirror <url>',
        "Debian mirror images are built from (env CAIRN_DEBIAN_MIRROR; default: the one this host's apt uses)",
      )
      .option(
        '--max-image-mib <mib>',
        'largest image root a build or pull may leave, in MiB (env CAIRN_MAX_IMAGE_MIB; default 4096)',
        positiveInt,
      )
      .option(
        '--max-images-per-tenant <n>',
        "distinct images one tenant's revisions may run on (env CAIRN_MAX_IMAGES_PER_TENANT; default 8)",
        positiveInt,
      ),
  )
  for (const [flag, description, parse] of OPERATOR_LIMIT_FLAGS) command.option(flag, description, parse)
  command.action(async (options: ServerOptions) => {
    const { out } = ctx
    if (options.role !== undefined && options.role !== 'all' && options.role !== 'api') {
      throw new UsageError(`--role must be all or api, not '${options.role}'`)
    }
    if (options.storage !== undefined && options.storage !== 'btrfs' && options.storage !== 'dir') {
      throw new UsageError(`--storage must be btrfs or dir, not '${options.storage}'`)
    }
    // Loaded here so that every other command starts without the server's dependencies.
    const { startServer } = await import('@cairn/server')
    // Listened for before anything is mounted: a stop signal from here on is a clean stop.
    const stopSignal = listenForStop()
    const server = await startServer({
      dataDir: options.dataDir,
      port: options.port,
      host: options.host,
      previewPort: options.previewPort,
      previewDomain: options.previewDomain,
      compatPrefix: options.compatPrefix,
      poolPath: options.poolPath,
      database: options.database,
      role: options.role,
      clusterDir: options.clusterDir,
      s3Bucket: options.s3Bucket,
      s3Endpoint: options.s3Endpoint,
      s3Prefix: options.s3Prefix,
      recoverLost: recoverLostOption(options.recoverLost),
      storage: options.storage,
      workspaceQuotaMiB: options.workspaceQuotaMib,
      tenantQuotaMiB: options.tenantQuotaMib,
      poolReserveMiB: options.poolReserveMib,
      imagesQuotaMiB: options.imagesQuotaMib,
      isolation: options.isolation,
      egressPrivateExceptions: options.egressAllowPrivate?.split(',').filter(Boolean),
      webhookAllowCidrs: options.webhookAllowCidr?.split(',').filter(Boolean),
      buildEgressAllow: options.buildEgressAllow?.split(',').filter(Boolean),
      defaultImage: options.defaultImage,
      debianMirror: options.debianMirror,
      maxImageMiB: options.maxImageMib,
      maxImagesPerTenant: options.maxImagesPerTenant,
      logLevel: options.logLevel ?? (ctx.json ? 'warn' : undefined),
      operatorLimits: {
        maxMemoryMiB: options.maxMemoryMib,
        maxPids: options.maxPids,
        maxCpus: options.maxCpus,
        maxTurnTimeoutMs: options.maxTurnTimeoutMs,
        maxSetupTimeoutMs: options.maxSetupTimeoutMs,
        maxSandboxesPerTenant: options.maxSandboxesPerTenant,
        sandboxWaitMs: options.sandboxWaitMs,
        maxBuildsPerTenant: options.maxBuildsPerTenant,
        maxManualSnapshotsPerSession: options.maxSnapshotsPerSession,
        maxManualSnapshotsPerTenant: options.maxSnapshotsPerTenant,
        maxKeysPerTenant: options.maxKeysPerTenant,
        tenantRateLimitPerSecond: options.tenantRateLimit,
        maxConnections: options.maxConnections,
        maxConnectionsPerPeer: options.maxConnectionsPerPeer,
        headersTimeoutMs: options.headersTimeoutMs,
        idleTimeoutMs: options.idleTimeoutMs,
        requestTimeoutMs: options.requestTimeoutMs,
      },
    }).catch(explainHostRefusal)
    if (ctx.json) {
      out.record({
        url: server.url,
        previews: `http://<port>-ses-<id>.${server.previewDomain}:${server.previewPort}`,
        dataDir: server.dataDir,
        adminKeyPath: server.adminKeyPath,
        adminKeyCreated: server.adminKey !== undefined,
        credentialsPath: server.credentialsWritten ?? null,
      })
    } else {
      out.line(`Cairn server listening on ${out.c.bold(server.url)}`)
      out.line(`Previews:      http://<port>-ses-<id>.${server.previewDomain}:${server.previewPort}`)
      out.line(`Data:          ${server.dataDir}`)
      out.line(`Admin API key: ${server.adminKeyPath}${server.adminKey ? ' (created now)' : ''}`)
      if (server.credentialsWritten)
        out.line(`Credentials:   ${server.credentialsWritten} (the CLI uses them)`)
      out.progress('Press Ctrl-C to stop.')
    }
    await closeOnSignal(out, server, stopSignal)
  })
}

function recoverLostOption(value: string | undefined): 'eager' | 'on-message' | undefined {
  if (value === undefined || value === 'eager' || value === 'on-message') return value
  throw new UsageError(`--recover-lost must be eager or on-message, not '${value}'`)
}
