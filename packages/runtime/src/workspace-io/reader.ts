import { isUtf8 } from 'node:buffer'
import { type ChildProcessByStdio, spawn } from 'node:child_process'
import { PassThrough, type Readable } from 'node:stream'
import { fileURLToPath } from 'node:url'
import { CairnProblem, isErrorCode } from '@cairn/protocol'
import { OWN_PROCESS_GROUP } from '../util/process-group.js'

/**
 * The only host-side reader of workspace trees: a python3 helper (helpers/workspace-reader.py)
 * that walks by file descriptors beneath one opened on the tree's root, O_NOFOLLOW at every
 * component, never opens anything but regular files, and skips holes. One process per request,
 * off the event loop, killed when the request ends or its time is up.
 */
const HELPER = fileURLToPath(new URL('../../helpers/workspace-reader.py', import.meta.url))

/** A limit on any one read; listings and diffs take milliseconds, digests of big trees longer. */
export const READ_TIMEOUT_MS = 10 * 60_000
/** Niceness of whole-tree reads (digests, exports), so they yield the CPU to the sessions' turns. */
export const BACKGROUND_NICENESS = 10
/** A file download is cut after this long (as an export is). */
export const CONTENT_TIMEOUT_MS = 30 * 60_000

export interface ReadOptions {
  /** Aborts (kills the helper) when the client goes away. */
  signal?: AbortSignal | undefined
  timeoutMs?: number | undefined
  /** A whole-tree read (a digest): run at a lower CPU priority. */
  background?: boolean | undefined
  /** What is read, for messages (`/workspace/docs`). */
  subject?: string | undefined
}

type Helper = ChildProcessByStdio<null, Readable, Readable>

function startHelper(root: string, args: string[], options: ReadOptions): Helper {
  const python = ['python3', '-I', '-S', HELPER, root, ...args]
  // Whole-tree reads yield the CPU to the sessions' turns.
  const command = options.background ? ['nice', '-n', String(BACKGROUND_NICENESS), ...python] : python
  const child = spawn(command[0] ?? 'python3', command.slice(1), {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { PATH: '/usr/bin:/bin', LC_ALL: 'C.UTF-8' },
    ...OWN_PROCESS_GROUP,
  })
  const kill = () => child.kill('SIGKILL')
  const timer = setTimeout(kill, options.timeoutMs ?? READ_TIMEOUT_MS)
  timer.unref()
  if (options.signal?.aborted) kill()
  options.signal?.addEventListener('abort', kill, { once: true })
  child.once('close', () => {
    clearTimeout(timer)
    options.signal?.removeEventListener('abort', kill)
  })
  return child
}

/** What a helper that failed means: its typed refusal, the client's departure, or a storage error. */
function failure(
  stdout: Buffer,
  stderr: string,
  code: number | null,
  signal: NodeJS.Signals | null,
  options: ReadOptions,
): CairnProblem {
  if (code === 3) {
    const [tag, errorCode, message = ''] = (stdout.toString('utf8').trim().split('\n').pop() ?? '').split(
      '\t',
    )
    if (tag === 'error' && isErrorCode(errorCode))
      return new CairnProblem(errorCode, options.subject ? `${options.subject}: ${message}` : message)
  }
  if (options.signal?.aborted)
    return new CairnProblem('conflict', 'the client went away; the read was stopped')
  if (signal === 'SIGKILL')
    return new CairnProblem('timeout', 'reading the workspace took too long and was stopped')
  return new CairnProblem(
    'storage_error',
    `reading the workspace failed: ${stderr.trim().split('\n').pop() || `exit ${code}`}`,
  )
}

/** Runs a helper command to completion and returns what it printed. */
export async function readTree(root: string, args: string[], options: ReadOptions = {}): Promise<Buffer> {
  const child = startHelper(root, args, options)
  const chunks: Buffer[] = []
  let stderr = ''
  child.stdout.on('data', (chunk: Buffer) => chunks.push(chunk))
  child.stderr.on('data', (chunk: Buffer) => {
    stderr = (stderr + chunk.toString('utf8')).slice(-2000)
  })
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve, reject) => {
    child.once('error', reject)
    child.once('close', (c, s) => resolve([c, s]))
  })
  const stdout = Buffer.concat(chunks)
  if (code !== 0) throw failure(stdout, stderr, code, signal, options)
  return stdout
}

/** A path's bytes as the helper takes them. */
export function pathArg(rel: Buffer | string): string {
  return (typeof rel === 'string' ? Buffer.from(rel, 'utf8') : rel).toString('base64')
}

/**
 * Opens a regular file beneath the root for streaming: its size, and a stream of exactly its
 * bytes. Anything else (a directory, a FIFO, a socket, a device, a link at any component) is
 * refused before a byte is sent. The helper is killed when the stream is destroyed.
 */
export async function openTreeFile(
  root: string,
  rel: Buffer,
  options: ReadOptions = {},
): Promise<{ size: number; stream: Readable }> {
  const subject = options.subject ?? `/workspace/${rel.toString('utf8')}`
  const child = startHelper(root, ['read', pathArg(rel)], {
    timeoutMs: CONTENT_TIMEOUT_MS,
    ...options,
    subject,
  })
  let stderr = ''
  child.stderr.on('data', (chunk: Buffer) => {
    stderr = (stderr + chunk.toString('utf8')).slice(-2000)
  })
  const exited = new Promise<[number | null, NodeJS.Signals | null]>((resolve) => {
    child.once('close', (c, s) => resolve([c, s]))
    // python3 missing or not startable: answered as a failed read, never an unhandled 'error'.
    child.once('error', (error) => {
      stderr += String(error)
      resolve([1, null])
    })
  })
  // The first line says the size (or why not); the rest is the content.
  const stdout = child.stdout
  const head = await new Promise<{ line: string | undefined; rest: Buffer }>((resolve) => {
    let buffered = Buffer.alloc(0)
    const onData = (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk])
      const nl = buffered.indexOf(10)
      if (nl < 0) return
      stdout.off('data', onData)
      stdout.off('end', onEnd)
      stdout.pause()
      resolve({ line: buffered.subarray(0, nl).toString('utf8'), rest: buffered.subarray(nl + 1) })
    }
    const onEnd = () => resolve({ line: undefined, rest: buffered })
    stdout.on('data', onData)
    stdout.once('end', onEnd)
    void exited.then(onEnd)
  })
  const [tag, sizeText] = (head.line ?? '').split('\t')
  const size = Number(sizeText)
  if (tag === 'size' && Number.isSafeInteger(size)) {
    // Handed on through a stream of our own: when the child exits, node resumes its stdout, which
    // would drop whatever the caller has not read yet.
    // It ends at the size's last byte, not at the helper's exit: a helper under nice on a busy host
    // exits late, and a response (and its heavy-read slot) held open after the client has every
    // byte leaves a keep-alive connection busy (a server's close waits on it; a next read is refused).
    const body = new PassThrough()
    body.once('close', () => child.kill('SIGKILL'))
    passBytes(stdout, head.rest, size, body)
    return { size, stream: body }
  }
  const [code, signal] = await exited
  throw failure(Buffer.from(head.line ?? ''), stderr, code, signal, { ...options, subject })
}

/** Writes `first`, then what `stdout` gives, into `body` up to `size` bytes, and ends it there. */
function passBytes(stdout: Readable, first: Buffer, size: number, body: PassThrough): void {
  let left = size
  const pass = (chunk: Buffer) => {
    if (body.destroyed) return finish()
    const part = chunk.subarray(0, left)
    left -= part.length
    const flowing = part.length === 0 || body.write(part)
    if (left === 0) return finish()
    if (!flowing) {
      stdout.pause()
      body.once('drain', () => stdout.resume())
    }
  }
  const finish = () => {
    stdout.off('data', pass)
    stdout.off('end', finish)
    if (!body.destroyed) body.end()
  }
  stdout.on('data', pass)
  stdout.once('end', finish)
  pass(first)
  if (left > 0) stdout.resume()
}

/** One entry as the helper prints it (`list`, `stamps`). */
export interface TreeEntryLine {
  /** The name (or, from `stamps`, the path below the root): its bytes. */
  name: Buffer
  type: 'file' | 'directory' | 'symlink' | 'other'
  size: number
  mode: number
  mtimeNs: bigint
  /** A link's target: its bytes, base64 (empty for anything else). */
  target: string
}

const TYPES = new Set(['file', 'directory', 'symlink', 'other'])

export function parseEntries(output: Buffer): TreeEntryLine[] {
  const out: TreeEntryLine[] = []
  for (const line of output.toString('latin1').split('\n')) {
    if (line === '') continue
    const [name = '', type = '', size = '', mode = '', mtimeNs = '', target = ''] = line.split('\t')
    if (!TYPES.has(type))
      throw new CairnProblem('internal', `the workspace reader printed an unknown entry: ${line}`)
    out.push({
      name: Buffer.from(name, 'base64'),
      type: type as TreeEntryLine['type'],
      size: Number(size),
      mode: Number(mode),
      mtimeNs: BigInt(mtimeNs),
      target,
    })
  }
  return out
}

/** A name as the API carries it: the string when it is UTF-8, plus its bytes in base64 when not. */
export function wireName(raw: Buffer): { text: string; base64?: string } {
  if (isUtf8(raw)) return { text: raw.toString('utf8') }
  return { text: raw.toString('utf8'), base64: raw.toString('base64') }
}
