import { createRequire } from 'node:module'

type S3Sdk = typeof import('@aws-sdk/client-s3')

let sdk: S3Sdk | undefined

/**
 * The AWS SDK's S3 client, loaded when a bucket is first made or used rather than with the
 * runtime: it is ~180 modules and ~0.2 s of CPU (on a loaded 2-core machine) that every process
 * without shipping (a single server, `cairn` commands, each test file) paid at start. The package
 * is CommonJS, so a synchronous require keeps the bucket's constructors synchronous.
 */
export function s3Sdk(): S3Sdk {
  sdk ??= createRequire(import.meta.url)('@aws-sdk/client-s3') as S3Sdk
  return sdk
}
