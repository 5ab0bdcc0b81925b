import { createHash } from 'node:crypto'
import type { ListObjectsV2CommandOutput, S3Client } from '@aws-sdk/client-s3'
import { CairnProblem } from '@cairn/protocol'
import { type BucketBounds, CallDeadline, DEFAULT_BUCKET_BOUNDS } from './bucket-bounds.js'
import { s3Sdk } from './s3-sdk.js'

/** What S3 errors carry that tells them apart (the SDK's ServiceException shape). */
interface S3Failure {
  name?: string
  message?: string
  $metadata?: { httpStatusCode?: number }
}

function statusOf(error: unknown): number | undefined {
  return (error as S3Failure)?.$metadata?.httpStatusCode
}

/**
 * An object store failure as a typed, retryable problem (unreachable, 5xx, throttled, or too slow:
 * the call passed its deadline).
 */
function unreachable(what: string, error: unknown, deadline?: CallDeadline): CairnProblem {
  if (deadline?.passed)
    return new CairnProblem('shipping_failed', `${what} failed: ${deadline.reason}`, { status: undefined })
  const failure = error as S3Failure
  const status = statusOf(error)
  return new CairnProblem(
    'shipping_failed',
    `${what} failed: ${failure?.name ?? 'error'}${status ? ` (HTTP ${status})` : ''}: ${failure?.message ?? String(error)}`,
    { status },
  )
}

export function sha256Hex(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex')
}

/** Whether `putOnce` wrote the object or found the same bytes already there. */
export type PutOutcome = 'written' | 'exists'

/**
 * The bucket workspaces ship to, as this module uses it: every object is written once with
 * `If-None-Match: *`, so nothing is ever overwritten, and each carries its SHA-256 in its metadata
 * (`x-amz-meta-sha256`) so a writer that finds a key taken can tell its own earlier write (the
 * reply lost, say) from another writer's bytes.
 */
export class ShippingBucket {
  constructor(
    readonly client: S3Client,
    readonly name: string,
    /** Prepended to every key (e.g. `cairn/`), so one bucket can hold several installs. */
    readonly prefix = '',
    /** Each call's deadline: a fixed bound plus its bytes at the least rate taken. */
    private readonly bounds: BucketBounds = DEFAULT_BUCKET_BOUNDS,
  ) {}

  key(rel: string): string {
    return `${this.prefix}${rel}`
  }

  /**
   * Writes `body` at `rel` unless the key exists. A 412 (the key is taken) is answered by reading
   * the object's size and recorded digest: the same bytes are `exists`, anything else is a
   * `shipping_conflict` (never overwritten).
   */
  async putOnce(
    rel: string,
    body: Uint8Array,
    contentType = 'application/octet-stream',
  ): Promise<PutOutcome> {
    const sha256 = sha256Hex(body)
    const { PutObjectCommand } = s3Sdk()
    const deadline = new CallDeadline(this.bounds, body.byteLength)
    try {
      await this.client.send(
        new PutObjectCommand({
          Bucket: this.name,
          Key: this.key(rel),
          Body: body,
          ContentLength: body.byteLength,
          ContentType: contentType,
          IfNoneMatch: '*',
          Metadata: { sha256 },
        }),
        { abortSignal: deadline.signal },
      )
      return 'written'
    } catch (error) {
      if (deadline.passed || statusOf(error) !== 412)
        throw unreachable(`writing ${this.key(rel)}`, error, deadline)
    } finally {
      deadline.done()
    }
    const found = await this.head(rel)
    if (found && found.bytes === body.byteLength && found.sha256 === sha256) return 'exists'
    throw new CairnProblem(
      'shipping_conflict',
      `${this.key(rel)} already holds other bytes (${found?.bytes ?? '?'} bytes, sha256 ${found?.sha256 ?? 'unrecorded'}; this writer has ${body.byteLength} bytes, sha256 ${sha256}): it is never overwritten`,
      { key: this.key(rel) },
    )
  }

  /** An object's size and recorded digest; undefined when there is none. */
  async head(rel: string): Promise<{ bytes: number; sha256: string | undefined } | undefined> {
    const { HeadObjectCommand } = s3Sdk()
    const deadline = new CallDeadline(this.bounds)
    try {
      const found = await this.client.send(new HeadObjectCommand({ Bucket: this.name, Key: this.key(rel) }), {
        abortSignal: deadline.signal,
      })
      return { bytes: found.ContentLength ?? 0, sha256: found.Metadata?.sha256 }
    } catch (error) {
      if (!deadline.passed && (statusOf(error) === 404 || (error as S3Failure)?.name === 'NotFound'))
        return undefined
      throw unreachable(`reading ${this.key(rel)}`, error, deadline)
    } finally {
      deadline.done()
    }
  }

  /** An object's bytes, refused (`chain_invalid`) beyond `maxBytes`; undefined when there is none. */
  async get(rel: string, maxBytes: number): Promise<Buffer | undefined> {
    let body: Uint8Array
    const { GetObjectCommand } = s3Sdk()
    const deadline = new CallDeadline(this.bounds)
    try {
      const got = await this.client.send(new GetObjectCommand({ Bucket: this.name, Key: this.key(rel) }), {
        abortSignal: deadline.signal,
      })
      if ((got.ContentLength ?? 0) > maxBytes) {
        got.Body?.transformToWebStream().cancel()
        throw new CairnProblem('chain_invalid', `${this.key(rel)} is larger than ${maxBytes} bytes`)
      }
      // The body's deadline is its length's (at most maxBytes: one without a length is read no longer).
      deadline.answer(got.ContentLength ?? maxBytes, got.Body)
      body = (await got.Body?.transformToByteArray()) ?? new Uint8Array()
    } catch (error) {
      if (error instanceof CairnProblem) throw error
      if (!deadline.passed && (statusOf(error) === 404 || (error as S3Failure)?.name === 'NoSuchKey'))
        return undefined
      throw unreachable(`reading ${this.key(rel)}`, error, deadline)
    } finally {
      deadline.done()
    }
    if (body.byteLength > maxBytes)
      throw new CairnProblem('chain_invalid', `${this.key(rel)} is larger than ${maxBytes} bytes`)
    return Buffer.from(body.buffer, body.byteOffset, body.byteLength)
  }

  /** Every key under `rel` (the prefix stripped), in the store's (lexicographic) order. */
  async list(rel: string): Promise<string[]> {
    const keys: string[] = []
    const { ListObjectsV2Command } = s3Sdk()
    let token: string | undefined
    do {
      let page: ListObjectsV2CommandOutput
      const deadline = new CallDeadline(this.bounds)
      try {
        page = await this.client.send(
          new ListObjectsV2Command({ Bucket: this.name, Prefix: this.key(rel), ContinuationToken: token }),
          { abortSignal: deadline.signal },
        )
      } catch (error) {
        throw unreachable(`listing ${this.key(rel)}`, error, deadline)
      } finally {
        deadline.done()
      }
      for (const item of page.Contents ?? []) if (item.Key) keys.push(item.Key.slice(this.prefix.length))
      token = page.IsTruncated ? page.NextContinuationToken : undefined
    } while (token)
    return keys
  }
}
