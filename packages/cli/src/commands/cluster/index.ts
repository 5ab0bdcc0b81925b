import { jsonOption, type Register } from '../../command.js'
import { UsageError } from '../../errors.js'

export const register: Register = (parent, ctx) => {
  const cluster = parent.command('cluster').description("Set up a cluster's shared material")
  jsonOption(
    cluster
      .command('init')
      .description(
        'Write a cluster CA and the certificates of the API replicas (cairn-api) and the runtime nodes (cairn-node)',
      )
      .option('--dir <dir>', 'where to write them (a new directory, or one without a CA)'),
  ).action(async (options: { dir?: string }) => {
    if (!options.dir) throw new UsageError('give --dir <dir>')
    // Loaded here so that every other command starts without the server's dependencies.
    const { initClusterTls } = await import('@cairn/server')
    const files = await initClusterTls(options.dir)
    if (ctx.json) {
      ctx.out.record({ dir: options.dir, files })
      return
    }
    ctx.out.line(`Wrote the cluster CA and certificates to ${options.dir}:`)
    for (const file of files) ctx.out.line(`  ${file}`)
    ctx.out.line(
      'Give api.pem, api-key.pem and ca.pem to API replicas, node.pem, node-key.pem and ca.pem to nodes (--cluster-dir); keep ca-key.pem offline.',
    )
  })
}
