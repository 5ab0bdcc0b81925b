import type { IncomingHttpHeaders } from 'node:http'
import type { Readable } from 'node:stream'
import { CairnProblem, type DeployResult } from '@cairn/protocol'
import { Busboy, type BusboyInstance } from '@fastify/busboy'
import { Value } from '@sinclair/typebox/value'
import YAML from 'yaml'
import type { AgentService } from '../agents/agent-service.js'
import { CompatDeployConfig, CompatDeployFields } from './schemas.js'

export interface CompatDeployForm {
  name: string
  command: string
  config: CompatDeployConfig
  archive: Buffer
}

/** Reads their multipart deploy form (`file`, `name`, `command`, `config`) with the platform's own parser. */
/** What a deploy form may hold besides its file: a few short fields. */
const FORM_LIMITS = { fields: 8, fieldSize: 64 * 1024, fieldNameSize: 100, parts: 12, headerPairs: 20 }

/**
 * Reads their multipart deploy form (`file`, `name`, `command`, `config`) as it streams in: the
 * fields, and the file part (the project's tar.gz, compressed as it came) collected up to
 * `maxUploadBytes`, the cap the native deploy puts on its body. Nothing is unpacked here: the
 * archive goes to the native deploy's checks as it is.
 */
export async function readDeployForm(
  body: Readable,
  headers: IncomingHttpHeaders,
  maxUploadBytes: number,
): Promise<CompatDeployForm> {
  const { fields, archive } = await readParts(body, headers, maxUploadBytes)
  const clean = Object.fromEntries(Object.entries(fields).filter(([, v]) => v !== undefined))
  if (!Value.Check(CompatDeployFields, clean)) {
    const first = [...Value.Errors(CompatDeployFields, clean)][0]
    throw new CairnProblem(
      'validation_failed',
      `deploy form field ${first?.path.slice(1) || '?'}: ${first?.message ?? 'invalid'}`,
    )
  }
  if (archive === undefined) {
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
  return { name: clean.name, command: clean.command, config, archive }
}

/** The form's text fields (the first of each name) and its `file` part, read with busboy. */
function readParts(
  body: Readable,
  headers: IncomingHttpHeaders,
  maxUploadBytes: number,
): Promise<{ fields: Record<string, string | undefined>; archive: Buffer | undefined }> {
  const invalid = (message: string) =>
    new CairnProblem('bad_request', `the deploy form is not valid multipart/form-data: ${message}`)
  return new Promise((resolve, reject) => {
    const fields: Record<string, string | undefined> = {
      name: undefined,
      command: undefined,
      config: undefined,
    }
    let archive: Buffer | undefined
    let parser: BusboyInstance
    try {
      parser = Busboy({
        headers: { ...headers, 'content-type': headers['content-type'] ?? '' },
        limits: { ...FORM_LIMITS, files: 1, fileSize: maxUploadBytes },
      })
    } catch (error) {
      reject(invalid((error as Error).message))
      return
    }
    const fail = (problem: CairnProblem) => {
      body.unpipe(parser)
      body.resume()
      reject(problem)
    }
    parser.on('field', (name, value, _nameTruncated, valueTruncated) => {
      if (valueTruncated) fail(invalid(`field ${name} is longer than ${FORM_LIMITS.fieldSize} bytes`))
      else if (name in fields && fields[name] === undefined) fields[name] = value
    })
    parser.on('file', (name, stream) => {
      if (name !== 'file' || archive !== undefined) return void stream.resume()
      const chunks: Buffer[] = []
      stream.on('data', (chunk: Buffer) => chunks.push(chunk))
      stream.on('limit', () =>
        fail(
          new CairnProblem('payload_too_large', `the project tarball is larger than ${maxUploadBytes} bytes`),
        ),
      )
      stream.on('end', () => {
        if (!stream.truncated) archive = Buffer.concat(chunks)
      })
    })
    for (const limit of ['partsLimit', 'fieldsLimit', 'filesLimit'] as const)
      parser.on(limit, () => fail(invalid('it has more parts than a deploy form')))
    parser.on('error', (error: unknown) => fail(invalid((error as Error).message)))
    parser.on('finish', () => resolve({ fields, archive }))
    // The server's body budget refusing the rest is answered as itself, not as a broken form.
    body.on('error', (error) => fail(error instanceof CairnProblem ? error : invalid(error.message)))
    body.pipe(parser)
  })
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
 * Deploys their tarball through Cairn's own deploy, as it came: the native deploy's size,
 * decompression and hostile-archive checks, unpacked by the runtime into the staging tree, with
 * the generated cairn.yaml given beside it (it wins over any of the project's own).
 */
export async function deployForm(
  agents: AgentService,
  tenantId: string,
  form: CompatDeployForm,
): Promise<DeployResult> {
  const manifest = YAML.stringify(manifestOf(form))
  return agents.deploy(tenantId, form.archive, { name: form.name, wait: true, manifest })
}
