import { jsonOption, type Register } from '../command.js'
import { UsageError } from '../errors.js'

interface MigrateOptions {
  from?: string
  to?: string
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('migrate')
      .description(
        "Move a SQLite install's control plane into an empty PostgreSQL database (stop its server first)",
      )
      .option('--from <dir-or-file>', "the install's data dir (or its cairn.db)")
      .option('--to <url>', 'a postgres:// URL of an empty database'),
  ).action(async (options: MigrateOptions) => {
    if (!options.from || !options.to) throw new UsageError('give --from <data dir> and --to <postgres://…>')
    // Loaded here so that every other command starts without the server's dependencies.
    const { migrateToPostgres } = await import('@cairn/server')
    const report = await migrateToPostgres(options.from, options.to)
    if (ctx.json) {
      ctx.out.record({ from: report.from, to: report.to, rows: report.rows })
      return
    }
    const total = Object.values(report.rows).reduce((a, b) => a + b, 0)
    ctx.out.line(`Copied ${total} rows from ${report.from} to ${report.to}:`)
    for (const [table, rows] of Object.entries(report.rows)) if (rows > 0) ctx.out.line(`  ${table}: ${rows}`)
    ctx.out.line(
      `Start the server with the same data dir (its storage pool) and --database ${report.to.replace(/:\*\*\*@/, ':…@')}`,
    )
  })
}
