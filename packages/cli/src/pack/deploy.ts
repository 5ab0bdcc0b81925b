import { existsSync } from 'node:fs'
import { stat } from 'node:fs/promises'
import path from 'node:path'
import type { DeployResult, RevisionInfo } from '@cairn/sdk'
import type { Context } from '../context.js'
import { CancelledError, CliError, UsageError } from '../errors.js'
import { oneLine, stripTerminalEscapes } from '../format/sanitize.js'
import { formatBytes } from '../format/time.js'
import { canPrompt, confirm } from '../prompt.js'
import { projectIgnore } from './ignore-rules.js'
import {
  agentNameFrom,
  findEntry,
  inferCommand,
  isValidAgentName,
  readLocalManifest,
  renderManifest,
} from './manifest.js'
import { packProject } from './pack.js'

export interface DeployOptions {
  dir?: string
  name?: string
  yes?: boolean
}

const LARGE_FILES = 5000
const LARGE_BYTES = 50 * 1024 * 1024

/** The project directory and, when one was named, the entry file inside it. */
async function locate(
  target: string | undefined,
  dirOption: string | undefined,
): Promise<{ dir: string; entry?: string }> {
  // A path that cannot be stat'ed is "neither file nor directory": the callers say what was expected.
  const kind = async (p: string) => (await stat(p).catch(() => undefined))?.isDirectory()
  if (dirOption !== undefined) {
    const dir = path.resolve(dirOption)
    if ((await kind(dir)) !== true) throw new UsageError(`Not a directory: ${dirOption}`)
    if (target === undefined) return { dir }
    const entry = existsSync(path.join(dir, target)) ? path.join(dir, target) : path.resolve(target)
    const rel = path.relative(dir, entry)
    if (rel.startsWith('..') || path.isAbsolute(rel))
      throw new UsageError(`${target} is not inside ${dirOption}`)
    if ((await kind(entry)) !== false) throw new UsageError(`No such file: ${target}`)
    return { dir, entry: rel }
  }
  if (target === undefined) return { dir: process.cwd() }
  const isDir = await kind(target)
  if (isDir === undefined) throw new UsageError(`No such file or directory: ${target}`)
  const full = path.resolve(target)
  return isDir ? { dir: full } : { dir: path.dirname(full), entry: path.basename(full) }
}

/** `cairn deploy`: locate, pack (ignore rules applied), upload, follow the build. */
export async function deploy(
  ctx: Context,
  target: string | undefined,
  options: DeployOptions,
): Promise<void> {
  const { out } = ctx
  if (options.name !== undefined && !isValidAgentName(options.name)) {
    throw new UsageError(
      `Invalid agent name '${options.name}'`,
      "Use lower-case letters, digits and '-' (up to 63).",
    )
  }
  const { dir, entry: named } = await locate(target, options.dir)
  const manifest = await readLocalManifest(dir)
  const extra: Record<string, string> = {}
  const ask = !options.yes && !ctx.json && canPrompt()
  if (manifest === undefined) {
    const entry = named ?? (await findEntry(dir))
    if (entry === undefined) {
      throw new CliError(`No cairn.yaml in ${dir}, and no entry file to run`, {
        hint: 'Write one with `cairn init`, or name the entry file: `cairn deploy agent.py`.',
      })
    }
    const command = inferCommand(entry)
    if (command === undefined) {
      throw new CliError(`Cannot tell how to run ${entry}`, {
        hint: 'Entry files ending in .py, .ts, .js, .mjs or .sh are understood; otherwise write cairn.yaml with `cairn init`.',
      })
    }
    const name = options.name ?? agentNameFrom(path.basename(dir))
    extra['cairn.yaml'] = renderManifest({ name, command, protocol: 'stdio' }, false)
    out.note(out.ec.dim(`No cairn.yaml: deploying ${name} as \`${command.join(' ')}\` (protocol stdio)`))
    if (ask && !(await confirm(`Deploy ${dir} as ${name}?`, true)))
      throw new CancelledError('Nothing deployed')
  } else if (named !== undefined) {
    out.note(out.ec.yellow(`Using ${path.basename(manifest.file)}; the entry file ${named} is not used`))
  }
  const spinner = out.step(`Packing ${dir}…`)
  let packed: Awaited<ReturnType<typeof packProject>>
  try {
    packed = await packProject(dir, await projectIgnore(dir, manifest?.ignore), extra)
  } finally {
    spinner.stop()
  }
  for (const link of packed.skipped)
    out.note(out.ec.yellow(`Skipped ${link}: a symlink pointing outside the project`))
  const size = `${packed.files.length} files, ${formatBytes(packed.bytes)}`
  if (ask && (packed.files.length > LARGE_FILES || packed.bytes > LARGE_BYTES)) {
    if (!(await confirm(`That is ${size}. Upload it all? (leave files out with .cairnignore)`, false))) {
      throw new CancelledError('Nothing deployed')
    }
  }
  const upload = out.step(`Uploading ${size} (${formatBytes(packed.archive.byteLength)} compressed)…`)
  const client = await ctx.client()
  let result: DeployResult
  try {
    result = await client.agents.deploy(packed.archive, { name: options.name })
  } finally {
    upload.stop()
  }
  const revision = await waitForBuild(ctx, result)
  result = { agent: result.agent, revision }
  if (ctx.json) out.data(result)
  if (revision.status === 'FAILED') {
    const error = new CliError(
      `The build of ${revision.id} failed: ${oneLine((revision.error ?? 'no reason given').split('\n')[0] ?? '')}`,
      {
        code: 'build_failed',
        hint: `See the whole log with \`cairn agents logs ${result.agent.name} ${revision.id}\`; fix the project and deploy again.`,
      },
    )
    if (!ctx.json) throw error
    out.error(error)
    throw new CliError('')
  }
  if (!ctx.json) {
    out.line(`Deployed ${oneLine(result.agent.name)} (${revision.id})`)
    out.progress(`${size}, revision ${revision.status}. Start a session with: cairn run ${result.agent.name}`)
  }
}

/**
 * Follows the build of a DEPLOYING revision: its log lines on stderr as they come, on a terminal or
 * not (a build can take a minute: a pipe or a CI log sees it go on), with `--json` too (stdout
 * carries only the result).
 */
async function waitForBuild(ctx: Context, result: DeployResult): Promise<RevisionInfo> {
  const { out } = ctx
  if (result.revision.status !== 'DEPLOYING') return result.revision
  const client = await ctx.client()
  out.note(out.ec.dim(`Building ${result.revision.id}…`))
  for await (const event of client.agents.followLogs(result.agent.id, result.revision.id)) {
    if (event.type !== 'log') break
    out.note(out.ec.dim(`  ${stripTerminalEscapes(event.line)}`))
  }
  return client.agents.revision(result.agent.id, result.revision.id)
}
