import { jsonOption, positiveIntOrZero, type Register } from '../command.js'
import { UsageError } from '../errors.js'

interface ServerOptions {
  dataDir?: string
  port?: number
  host?: string
  poolPath?: string
  storage?: string
  logLevel?: string
  workspaceQuotaMib?: number
  egressAllowPrivate?: string
  buildEgressAllow?: string
  isolation?: 'bwrap' | 'gvisor'
  previewPort?: number
  previewDomain?: string
  compatPrefix?: string
}

export const register: Register = (parent, ctx) => {
  jsonOption(
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
        '--compat-prefix <path>',
        "also serve the hosted agent-session API its own SDK and CLI speak, under this path (e.g. /superserve; their base URL is this server's URL plus it; env CAIRN_COMPAT_PREFIX; default off; see docs/compat.md)",
      )
      .option('--log-level <level>', 'log level: fatal, error, warn, info, debug, trace')
      .option(
        '--workspace-quota-mib <mib>',
        'size limit of each session workspace (btrfs qgroups; env CAIRN_WORKSPACE_QUOTA_MIB; default none)',
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
        '--build-egress-allow <hosts>',
        "comma-separated hosts every revision build may reach besides the agent's network.allow (env CAIRN_BUILD_EGRESS_ALLOW; default: the registries npm and pip are configured with; '' for none)",
      ),
  ).action(async (options: ServerOptions) => {
    const { out } = ctx
    if (options.storage !== undefined && options.storage !== 'btrfs' && options.storage !== 'dir') {
      throw new UsageError(`--storage must be btrfs or dir, not '${options.storage}'`)
    }
    // Loaded here so that every other command starts without the server's dependencies.
    const { startServer } = await import('@cairn/server')
    const server = await startServer({
      dataDir: options.dataDir,
      port: options.port,
      host: options.host,
      previewPort: options.previewPort,
      previewDomain: options.previewDomain,
      compatPrefix: options.compatPrefix,
      poolPath: options.poolPath,
      storage: options.storage,
      workspaceQuotaMiB: options.workspaceQuotaMib || undefined,
      isolation: options.isolation,
      egressPrivateExceptions: options.egressAllowPrivate?.split(',').filter(Boolean),
      buildEgressAllow: options.buildEgressAllow?.split(',').filter(Boolean),
      logLevel: options.logLevel ?? (ctx.json ? 'warn' : undefined),
    })
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
    const signal = await new Promise<NodeJS.Signals>((resolve) => {
      process.once('SIGINT', resolve)
      process.once('SIGTERM', resolve)
    })
    out.progress(`Received ${signal}, stopping…`)
    // A second signal while closing stops at once.
    const force = () => process.exit(130)
    process.once('SIGINT', force)
    process.once('SIGTERM', force)
    await server.close()
    process.off('SIGINT', force)
    process.off('SIGTERM', force)
    out.progress('Stopped.')
  })
}
