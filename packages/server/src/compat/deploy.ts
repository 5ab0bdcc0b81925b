import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { promisify } from 'node:util'
import { gunzip } from 'node:zlib'
import { CairnProblem, type DeployResult } from '@cairn/protocol'
import { Value } from '@sinclair/typebox/value'
import * as tar from 'tar'
import YAML from 'yaml'
import type { AgentService } from '../agents/agent-service.js'
import { type ArchiveLimits, inspectArchive } from '../agents/archive.js'
import { CompatDeployConfig, CompatDeployFields } from './schemas.js'

const gunzipAsync = promisify(gunzip)
/** A tar header and the padding of its last block, per entry: what an archive adds to its contents. */
const TAR_OVERHEAD_PER_ENTRY = 1024

export interface CompatDeployForm {
  name: string
  command: string
  config: CompatDeployConfig
  archive: Buffer
}

/** Reads their multipart deploy form (`file`, `name`, `command`, `config`) with the platform's own parser. */
export async function readDeployForm(body: Buffer, contentType: string): Promise<CompatDeployForm> {
  let form: FormData
  try {
    form = await new Response(body, { headers: { 'content-type': contentType } }).formData()
  } catch (error) {
    throw new CairnProblem(
      'bad_request',
      `the deploy form is not valid multipart/form-data: ${(error as Error).message}`,
    )
  }
  const text = (field: string) => {
    const value = form.get(field)
    return typeof value === 'string' ? value : undefined
  }
  const fields = { name: text('name'), command: text('command'), config: text('config') }
  const clean = Object.fromEntries(Object.entries(fields).filter(([, v]) => v !== undefined))
  if (!Value.Check(CompatDeployFields, clean)) {
    const first = [...Value.Errors(CompatDeployFields, clean)][0]
    throw new CairnProblem(
      'validation_failed',
      `deploy form field ${first?.path.slice(1) || '?'}: ${first?.message ?? 'invalid'}`,
    )
  }
  const file = form.get('file')
  if (file === null || typeof file === 'string') {
    throw new CairnProblem('validation_failed', 'deploy form field file: the project tarball is missing')
  }
  let config: unknown = {}
  if (clean.config !== undefined) {
    try {
      config = JSON.parse(clean.config)
    } catch {
      throw new CairnProblem('invalid_json', 'deploy form field config is not valid JSON')
    }
  }
  if (!Value.Check(CompatDeployConfig, config)) {
    const first = [...Value.Errors(CompatDeployConfig, config)][0]
    throw new CairnProblem(
      'invalid_manifest',
      `config${first?.path.replace(/\//g, '.') ?? ''}: ${first?.message ?? 'invalid'}`,
    )
  }
  return {
    name: clean.name,
    command: clean.command,
    config,
    archive: Buffer.from(await file.arrayBuffer()),
  }
}

/**
 * The cairn.yaml a deploy form stands for. Their HTTP mode (`--port`: the agent serves HTTP and each
 * message is a `POST localhost:PORT/run {"prompt"}`) is Cairn's `http` protocol on that port.
 */
export function manifestOf(form: CompatDeployForm): Record<string, unknown> {
  const http = form.config.mode === 'http'
  if (http && form.config.port === undefined) {
    throw new CairnProblem(
      'invalid_manifest',
      'config.mode http needs config.port, the port the agent serves HTTP on inside the sandbox (their `deploy --port`)',
      { mode: 'http' },
    )
  }
  if (http && form.config.protocol !== undefined && form.config.protocol !== 'http') {
    throw new CairnProblem(
      'invalid_manifest',
      `config.mode http is Cairn's http protocol; config.protocol ${form.config.protocol} contradicts it`,
      { mode: 'http', protocol: form.config.protocol },
    )
  }
  return {
    name: form.name,
    command: commandOf(form.command),
    protocol: http ? 'http' : (form.config.protocol ?? 'stdio'),
    ...(http ? { http: { port: form.config.port } } : {}),
    ...(form.config.secrets === undefined ? {} : { secrets: form.config.secrets }),
    ...(form.config.ignore === undefined ? {} : { ignore: form.config.ignore }),
  }
}

/**
 * Their zero-config deploy names the interpreter `python` (Python 3 in their sandboxes); Cairn's
 * sandboxes have the host's runtimes, where only `python3` is certain to be Python 3.
 */
export function commandOf(command: string): string {
  return command.replace(/^\s*python(?=\s)/, 'python3')
}

/**
 * Deploys their tarball through Cairn's own deploy: the tar (gunzipped within the archive limits)
 * gets a generated cairn.yaml appended, which wins over any of the project's own when unpacked,
 * and the agent service inspects and builds it as any other upload.
 */
export async function deployForm(
  agents: AgentService,
  tenantId: string,
  form: CompatDeployForm,
  limits: ArchiveLimits,
): Promise<DeployResult> {
  const manifest = manifestOf(form)
  const gzipped = form.archive[0] === 0x1f && form.archive[1] === 0x8b
  let plain: Buffer
  try {
    plain = gzipped
      ? await gunzipAsync(form.archive, {
          maxOutputLength: limits.maxUnpackedBytes + (limits.maxFiles + 2) * TAR_OVERHEAD_PER_ENTRY,
        })
      : form.archive
  } catch (error) {
    const code = (error as { code?: string }).code
    throw new CairnProblem(
      'invalid_archive',
      code === 'ERR_BUFFER_TOO_LARGE'
        ? `archive unpacks to more than ${limits.maxUnpackedBytes} bytes`
        : `archive is not a valid tar.gz: ${(error as Error).message}`,
    )
  }
  // Their archive as it came, under Cairn's own checks: appending to what is not a tar would
  // overwrite it, and deploy the manifest alone.
  await inspectArchive(plain, limits)
  const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-compat-'))
  try {
    const tarFile = path.join(dir, 'project.tar')
    const manifestDir = path.join(dir, 'manifest')
    await writeFile(tarFile, plain)
    await mkdir(manifestDir)
    await writeFile(path.join(manifestDir, 'cairn.yaml'), YAML.stringify(manifest))
    try {
      await tar.r({ file: tarFile, cwd: manifestDir, portable: true }, ['cairn.yaml'])
    } catch (error) {
      throw new CairnProblem('invalid_archive', `archive is not a valid tar.gz: ${(error as Error).message}`)
    }
    return await agents.deploy(tenantId, await readFile(tarFile), { name: form.name, wait: true })
  } finally {
    await rm(dir, { recursive: true, force: true })
  }
}
