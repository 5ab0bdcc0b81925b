import { CairnProblem } from '@cairn/protocol'
import { ShippingBucket } from './bucket.js'
import {
  bucketCallBoundMs,
  S3_CONNECT_TIMEOUT_MS,
  S3_IDLE_TIMEOUT_MS,
  S3_MAX_ATTEMPTS,
  S3_MIN_BYTES_PER_SECOND,
} from './bucket-bounds.js'
import { s3Sdk } from './s3-sdk.js'

/** Where workspaces ship to. Credentials come from the AWS SDK's own chain (AWS_ACCESS_KEY_ID …). */
export interface ShippingBucketConfig {
  bucket: string
  /** An S3-compatible endpoint (Ceph RGW, MinIO …); unset: AWS S3 itself. */
  endpoint?: string | undefined
  region?: string | undefined
  /** Prepended to every key, so one bucket can hold several installs. */
  prefix?: string | undefined
  /** A request is given up after this long with nothing sent or received (default `S3_IDLE_TIMEOUT_MS`). */
  idleTimeoutMs?: number | undefined
  /** A connection is given up after this long unopened (default `S3_CONNECT_TIMEOUT_MS`). */
  connectTimeoutMs?: number | undefined
  /** A call is given up past its bound plus its bytes at this rate (default `S3_MIN_BYTES_PER_SECOND`). */
  minBytesPerSecond?: number | undefined
}

/**
 * An S3 client for the bucket: path-style addressing when an endpoint is given (what RGW and most
 * S3-compatible stores expect), checksums only where an operation requires one (RGW refuses
 * the SDK's default trailing checksums on some versions), and bounded attempts: without timeouts a
 * store that accepts a connection and never answers held a ship or a restore for ever, and a
 * deadline per call scaled to its bytes: one that sends a byte now and then held them too.
 */
export function createShippingBucket(config: ShippingBucketConfig): ShippingBucket {
  if (!/^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/.test(config.bucket))
    throw new CairnProblem('validation_failed', `'${config.bucket}' is not a valid bucket name`)
  if (config.prefix && !/^[A-Za-z0-9._/-]*\/$/.test(config.prefix))
    throw new CairnProblem('validation_failed', 'the bucket prefix must end with / and hold no spaces')
  const idleTimeoutMs = config.idleTimeoutMs ?? S3_IDLE_TIMEOUT_MS
  const connectTimeoutMs = config.connectTimeoutMs ?? S3_CONNECT_TIMEOUT_MS
  const { S3Client } = s3Sdk()
  const client = new S3Client({
    region: config.region ?? 'us-east-1',
    ...(config.endpoint ? { endpoint: config.endpoint, forcePathStyle: true } : {}),
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
    maxAttempts: S3_MAX_ATTEMPTS,
    requestHandler: {
      connectionTimeout: connectTimeoutMs,
      socketTimeout: idleTimeoutMs,
    },
  })
  return new ShippingBucket(client, config.bucket, config.prefix ?? '', {
    callBoundMs: bucketCallBoundMs(idleTimeoutMs, connectTimeoutMs),
    minBytesPerSecond: config.minBytesPerSecond ?? S3_MIN_BYTES_PER_SECOND,
  })
}

/**
 * The bucket named by the environment (`CAIRN_S3_BUCKET`, `CAIRN_S3_ENDPOINT`, `CAIRN_S3_PREFIX`,
 * `AWS_REGION`; credentials `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, read by the SDK), as
 * deploy/ sets them; undefined when no bucket is set (shipping off).
 */
export function shippingBucketFromEnv(env: NodeJS.ProcessEnv = process.env): ShippingBucket | undefined {
  const bucket = env.CAIRN_S3_BUCKET?.trim()
  if (!bucket) return undefined
  return createShippingBucket({
    bucket,
    endpoint: env.CAIRN_S3_ENDPOINT?.trim() || undefined,
    region: env.AWS_REGION?.trim() || undefined,
    prefix: env.CAIRN_S3_PREFIX?.trim() || undefined,
  })
}
