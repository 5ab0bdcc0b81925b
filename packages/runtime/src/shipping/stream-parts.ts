import { type ChildProcessByStdio, spawn } from 'node:child_process'
import { createHash } from 'node:crypto'
import type { Readable, Writable } from 'node:stream'
import { CairnProblem, type ErrorCode } from '@cairn/protocol'
import { drained } from '../util/drained.js'
import { OWN_PROCESS_GROUP } from '../util/process-group.js'
import { type ShippingBucket, sha256Hex } from './bucket.js'
import { MAX_PART_BYTES, type ShippedStream } from './chain-link.js'

/** A tool whose stdout or stdin is a shipped stream (`btrfs send`, `btrfs receive`, tar). */
export interface StreamTool {
  child: ChildProcessByStdio<Writable | null, Readable | null, Readable>
  /** Resolves when the tool exits 0; rejects with its stderr as `code` otherwise. */
  done: Promise<void>
}

export function startTool(
  file: string,
  args: string[],
  io: 'read' | 'write',
  code: ErrorCode,
  options: { cwd?: string } = {},
): StreamTool {
  const child = spawn(file, args, {
    stdio: io === 'read' ? ['ignore', 'pipe', 'pipe'] : ['pipe', 'ignore', 'pipe'],
    ...OWN_PROCESS_GROUP,
    ...options,
  }) as StreamTool['child']
  let stderr = ''
  child.stderr.on('data', (chunk: Buffer) => {
    stderr = (stderr + chunk.toString('utf8')).slice(-4000)
  })
  child.stdin?.on('error', () => undefined)
  const done = new Promise<void>((resolve, reject) => {
    child.once('error', (error) =>
      reject(new CairnProblem(code, `${file} could not start: ${error.message}`)),
    )
    child.once('close', (exit, signal) => {
      if (exit === 0) resolve()
      else
        reject(
          new CairnProblem(
            code,
            `${file} ${args.join(' ')} failed (${signal ?? `exit ${exit}`}): ${stderr.trim()}`,
          ),
        )
    })
  })
  done.catch(() => undefined)
  return { child, done }
}

/** Reports a part confirmed in the bucket (for progress and for tests that cut the store mid-ship). */
export type PartObserver = (part: { key: string; bytes: number; index: number }) => void

/**
 * Cuts a stream into part objects of `partBytes` under `under` (`000001`, `000002` …), each
 * written once (`ShippingBucket.putOnce`), one at a time: the producer is read no faster than
 * the bucket takes the parts, so memory holds at most one part.
 */
export async function uploadParts(
  bucket: ShippingBucket,
  under: string,
  source: AsyncIterable<Buffer>,
  format: ShippedStream['format'],
  partBytes: number,
  onPart?: PartObserver,
): Promise<ShippedStream> {
  if (partBytes < 1 || partBytes > MAX_PART_BYTES)
    throw new CairnProblem('validation_failed', `a part must be 1 to ${MAX_PART_BYTES} bytes`)
  const whole = createHash('sha256')
  const parts: ShippedStream['parts'] = []
  let pending: Buffer[] = []
  let pendingBytes = 0
  let total = 0
  const flush = async () => {
    const body = Buffer.concat(pending, pendingBytes)
    pending = []
    pendingBytes = 0
    const key = `${under}${String(parts.length + 1).padStart(6, '0')}`
    await bucket.putOnce(key, body)
    parts.push({ key, bytes: body.byteLength, sha256: sha256Hex(body) })
    onPart?.({ key, bytes: body.byteLength, index: parts.length })
  }
  for await (const chunk of source) {
    whole.update(chunk)
    total += chunk.byteLength
    let offset = 0
    while (offset < chunk.byteLength) {
      const take = Math.min(partBytes - pendingBytes, chunk.byteLength - offset)
      pending.push(chunk.subarray(offset, offset + take))
      pendingBytes += take
      offset += take
      if (pendingBytes === partBytes) await flush()
    }
  }
  if (pendingBytes > 0) await flush()
  return { format, bytes: total, sha256: whole.digest('hex'), parts }
}

/**
 * Runs `produce` (a tool writing a stream to its stdout) into part objects; the tool is killed
 * if the upload fails, and its own failure fails the upload.
 */
export async function shipToolOutput(
  bucket: ShippingBucket,
  under: string,
  tool: StreamTool,
  format: ShippedStream['format'],
  partBytes: number,
  onPart?: PartObserver,
): Promise<ShippedStream> {
  const stdout = tool.child.stdout
  if (!stdout) throw new CairnProblem('internal', 'the stream tool has no stdout')
  try {
    const stream = await uploadParts(bucket, under, stdout, format, partBytes, onPart)
    await tool.done
    return stream
  } catch (error) {
    tool.child.kill('SIGKILL')
    await tool.done.catch(() => undefined)
    throw error
  }
}

/**
 * Feeds a shipped stream's parts, each read from the bucket and checked against the digest the
 * manifest recorded (and by `check`, when given), into `tool`'s stdin. A part missing or not matching is `chain_invalid` and
 * the tool is killed; the tool's own refusal is its error (the caller passes `chain_invalid`).
 */
export async function feedParts(
  bucket: ShippingBucket,
  stream: ShippedStream,
  tool: StreamTool,
  check?: { push(chunk: Buffer): void; finish(): void },
): Promise<void> {
  const stdin = tool.child.stdin
  if (!stdin) throw new CairnProblem('internal', 'the stream tool has no stdin')
  const whole = createHash('sha256')
  try {
    for (const part of stream.parts) {
      const body = await bucket.get(part.key, part.bytes)
      if (!body) throw new CairnProblem('chain_invalid', `part ${part.key} is missing from the bucket`)
      if (body.byteLength !== part.bytes || sha256Hex(body) !== part.sha256)
        throw new CairnProblem(
          'chain_invalid',
          `part ${part.key} does not match the digest its manifest recorded`,
        )
      whole.update(body)
      check?.push(body)
      // A tool that ended (it refused the stream) takes no more: its stdin is destroyed, a write
      // to it never drains, and its close has already been emitted.
      if (stdin.destroyed) break
      if (!stdin.write(body)) await drained(stdin, { until: tool.done })
      if (tool.child.exitCode !== null || tool.child.signalCode !== null) break
    }
    check?.finish()
    stdin.end()
    await tool.done
    if (whole.digest('hex') !== stream.sha256)
      throw new CairnProblem('chain_invalid', 'the stream does not match the digest its manifest recorded')
  } catch (error) {
    tool.child.kill('SIGKILL')
    await tool.done.catch(() => undefined)
    throw error
  }
}
