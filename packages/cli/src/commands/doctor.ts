import os from 'node:os'
import path from 'node:path'
import type { HostCheck, HostCheckArea, HostReport } from '@cairn/runtime/doctor'
import { jsonOption, type Register } from '../command.js'
import type { Context } from '../context.js'
import { CliError, UsageError } from '../errors.js'

interface DoctorOptions {
  dataDir?: string
  storage?: string
  poolPath?: string
  isolation?: string
}

/** `cairn doctor`'s exit status when the server would start without some of its features. */
export const EXIT_DEGRADED = 3

const AREAS: ReadonlyArray<readonly [HostCheckArea, string]> = [
  ['permission', 'Permissions'],
  ['kernel', 'Kernel'],
  ['package', 'Packages'],
]

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('doctor')
      .description(
        'Check this host for what cairn server uses: kernel features, packages, permissions; what each missing one costs and how to fix it (exit 0: all works; 1: the server would refuse to start; 3: it starts without some features)',
      )
      .option(
        '--data-dir <dir>',
        'the data dir the server would use (env CAIRN_DATA_DIR; default ~/.cairn/data)',
      )
      .option('--storage <driver>', 'btrfs (default) or dir, as cairn server takes it (env CAIRN_STORAGE)')
      .option('--pool-path <dir>', 'the pool path cairn server would be given (env CAIRN_POOL_PATH)')
      .option('--isolation <driver>', 'bwrap (default) or gvisor (env CAIRN_ISOLATION)'),
  ).action(async (options: DoctorOptions) => {
    const { env } = ctx
    const storage = options.storage ?? env.CAIRN_STORAGE ?? 'btrfs'
    if (storage !== 'btrfs' && storage !== 'dir')
      throw new UsageError(`--storage must be btrfs or dir, not '${storage}'`)
    const isolation = options.isolation ?? env.CAIRN_ISOLATION ?? 'bwrap'
    if (isolation !== 'bwrap' && isolation !== 'gvisor')
      throw new UsageError(`--isolation must be bwrap or gvisor, not '${isolation}'`)
    const dataDir = path.resolve(
      options.dataDir ?? env.CAIRN_DATA_DIR ?? path.join(os.homedir(), '.cairn', 'data'),
    )
    const poolPath = options.poolPath ?? env.CAIRN_POOL_PATH
    // Loaded here: every other command starts without it.
    const { checkHost } = await import('@cairn/runtime/doctor')
    const report = await checkHost({
      dataDir,
      storage,
      isolation,
      poolPath: poolPath === undefined ? undefined : path.resolve(poolPath),
      env,
      versions: true,
    })
    if (ctx.json) {
      ctx.out.record({
        canStart: report.refused.length === 0,
        refused: report.refused.map((c) => c.id),
        degraded: report.degraded.map((c) => c.id),
        options: { dataDir, storage, isolation, poolPath: poolPath ?? null },
        checks: report.checks,
      })
    } else printReport(ctx, report, `--storage ${storage} --isolation ${isolation}, data dir ${dataDir}`)
    if (report.refused.length > 0) throw new CliError('', { exitCode: 1 })
    if (report.degraded.length > 0) throw new CliError('', { exitCode: EXIT_DEGRADED })
  })
}

function printReport(ctx: Context, report: HostReport, options: string): void {
  const { out } = ctx
  const { c } = out
  out.line(`What cairn server (${options}) uses on this host:`)
  const width = Math.max(...report.checks.map((check) => check.what.length))
  for (const [area, title] of AREAS) {
    out.line()
    out.line(c.bold(title))
    for (const check of report.checks.filter((k) => k.area === area)) {
      out.line(`  ${mark(ctx, check)} ${check.what.padEnd(width)}  ${check.found}`)
      if (check.ok) continue
      out.line(`      ${c.dim('costs:')} ${check.costs}`)
      out.line(`      ${c.dim('fix:  ')} ${check.fix}`)
    }
  }
  out.line()
  const names = (checks: HostCheck[]) => checks.map((k) => k.what).join(', ')
  if (report.refused.length > 0)
    out.line(c.red(`cairn server would refuse to start here: it needs ${names(report.refused)}.`))
  else if (report.degraded.length > 0)
    out.line(c.yellow(`cairn server starts here, without what ${names(report.degraded)} give.`))
  else out.line(c.green('cairn server has everything it uses here.'))
}

/** ✓ works; ✗ the server needs it; ! a feature is lost; - costs nothing today. */
function mark(ctx: Context, check: HostCheck): string {
  const { c } = ctx.out
  if (check.ok) return c.green('✓')
  if (check.need === 'required') return c.red('✗')
  return check.need === 'feature' ? c.yellow('!') : c.dim('-')
}
