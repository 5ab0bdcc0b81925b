import { jsonOption, positiveInt, positiveIntOrZero, type Register } from '../command.js'
import { UsageError } from '../errors.js'
import { explainHostRefusal } from '../host-refusal.js'
import { closeOnSignal, listenForStop } from './until-signal.js'

interface NodeCommandOptions {
  database?: string
  clusterDir?: string
  listen?: string
  advertise?: string
  name?: string
  heartbeatMs?: number
  leaseMs?: number
  s3Bucket?: string
  s3Endpoint?: string
  s3Prefix?: string
  dataDir?: string
  storage?: string
  poolPath?: string
  isolation?: 'bwrap' | 'gvisor'
  workspaceQuotaMib?: number
  tenantQuotaMib?: number
  poolReserveMib?: number
  imagesQuotaMib?: number
  egressAllowPrivate?: string
  maxImageMib?: number
  logLevel?: string
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('node')
      .description(
        "Run this machine's runtime as a node of a cluster until Ctrl-C: its port served to the API replicas (mutual TLS), registered in the cluster's PostgreSQL",
      )
      .option(
        '--database <url>',
        "the cluster's PostgreSQL, a postgres:// URL as the node's own role in cairn_node (required; env CAIRN_DATABASE_URL; docs/cluster.md)",
      )
      .option(
        '--cluster-dir <dir>',
        'the certificates `cairn cluster init` wrote (ca.pem, node.pem, node-key.pem; env CAIRN_CLUSTER_DIR)',
      )
      .option(
        '--listen <host:port>',
        'where the runtime port listens (env CAIRN_NODE_LISTEN; default 127.0.0.1:7443; port 0: any)',
      )
      .option(
        '--advertise <url>',
        'where API replicas reach it (env CAIRN_NODE_ADVERTISE; default https://<listen host>:<port>)',
      )
      .option('--name <name>', "the node's name in `cairn nodes list` (default the host name)")
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
        '--heartbeat-ms <ms>',
        'how often the node renews its lease (env CAIRN_HEARTBEAT_MS; default 1000)',
        positiveInt,
      )
      .option(
        '--lease-ms <ms>',
        'how long a renewal holds: the node fences itself (stops every sandbox) when it could not renew within it, and the leader declares it lost after it (env CAIRN_LEASE_MS; default 5000; at least two heartbeats)',
        positiveInt,
      )
      .option(
        '--data-dir <dir>',
        'where the pool image, the runtime ID (the node ID) and the run state live (env CAIRN_DATA_DIR; default ~/.cairn/data)',
      )
      .option('--storage <driver>', 'workspace store: btrfs (default) or dir (env CAIRN_STORAGE)')
      .option(
        '--pool-path <dir>',
        'btrfs: an existing btrfs directory to use as the pool; dir: where the trees live',
      )
      .option(
        '--isolation <driver>',
        'default sandbox driver: bwrap (default) or gvisor (env CAIRN_ISOLATION)',
      )
      .option(
        '--workspace-quota-mib <mib>',
        'size limit of each session workspace, in MiB (0: off; env CAIRN_WORKSPACE_QUOTA_MIB)',
        positiveIntOrZero,
      )
      .option(
        '--tenant-quota-mib <mib>',
        "limit of what one tenant's trees hold on this node, in MiB (0: off; env CAIRN_TENANT_QUOTA_MIB)",
        positiveIntOrZero,
      )
      .option(
        '--pool-reserve-mib <mib>',
        "pool space kept free for Cairn's own writes, in MiB (env CAIRN_POOL_RESERVE_MIB)",
        positiveIntOrZero,
      )
      .option(
        '--images-quota-mib <mib>',
        'what the shared agent images may hold together in the pool, in MiB (env CAIRN_IMAGES_QUOTA_MIB)',
        positiveIntOrZero,
      )
      .option(
        '--egress-allow-private <addresses>',
        'comma-separated private addresses sandboxes may reach through the egress proxy',
      )
      .option(
        '--max-image-mib <mib>',
        'largest image root a build or pull may leave, in MiB (env CAIRN_MAX_IMAGE_MIB; default 4096)',
        positiveInt,
      )
      .option('--log-level <level>', 'log level: fatal, error, warn, info, debug, trace'),
  ).action(async (options: NodeCommandOptions) => {
    const { out } = ctx
    if (options.storage !== undefined && options.storage !== 'btrfs' && options.storage !== 'dir')
      throw new UsageError(`--storage must be btrfs or dir, not '${options.storage}'`)
    if (options.isolation !== undefined && options.isolation !== 'bwrap' && options.isolation !== 'gvisor')
      throw new UsageError(`--isolation must be bwrap or gvisor, not '${options.isolation}'`)
    // Loaded here so that every other command starts without the server's dependencies.
    const { startNode } = await import('@cairn/server')
    // Listened for before anything is mounted: a stop signal from here on is a clean stop.
    const stopSignal = listenForStop()
    const node = await startNode({
      database: options.database,
      clusterDir: options.clusterDir,
      listen: options.listen,
      advertise: options.advertise,
      name: options.name,
      heartbeatMs: options.heartbeatMs,
      leaseMs: options.leaseMs,
      s3Bucket: options.s3Bucket,
      s3Endpoint: options.s3Endpoint,
      s3Prefix: options.s3Prefix,
      dataDir: options.dataDir,
      storage: options.storage,
      poolPath: options.poolPath,
      isolation: options.isolation,
      workspaceQuotaMiB: options.workspaceQuotaMib,
      tenantQuotaMiB: options.tenantQuotaMib,
      poolReserveMiB: options.poolReserveMib,
      imagesQuotaMiB: options.imagesQuotaMib,
      egressPrivateExceptions: options.egressAllowPrivate?.split(',').filter(Boolean),
      maxImageMiB: options.maxImageMib,
      logLevel: options.logLevel ?? (ctx.json ? 'warn' : undefined),
    }).catch(explainHostRefusal)
    if (ctx.json) {
      out.record({
        nodeId: node.nodeId,
        url: node.url,
        address: node.address,
        epoch: node.registry.epoch ?? null,
        dataDir: node.dataDir,
      })
    } else {
      out.line(`Cairn node ${out.c.bold(node.nodeId)} serving its runtime on ${out.c.bold(node.url)}`)
      out.line(`Address:  ${node.address} (epoch ${node.registry.epoch ?? '-'})`)
      out.line(`Data:     ${node.dataDir}`)
      out.progress('Press Ctrl-C to stop (drain it first: cairn nodes drain <id>).')
    }
    await closeOnSignal(out, node, stopSignal)
  })
}
