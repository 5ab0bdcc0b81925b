import { CairnProblem } from '@cairn/protocol'
import { describe, expect, it } from 'vitest'
import { createShippingBucket, shippingBucketFromEnv } from './bucket-config.js'

describe('the shipping bucket from configuration', () => {
  it('is off without CAIRN_S3_BUCKET, and takes the names deploy/ sets', async () => {
    expect(shippingBucketFromEnv({})).toBeUndefined()
    const bucket = shippingBucketFromEnv({
      CAIRN_S3_BUCKET: 'cairn-workspaces',
      CAIRN_S3_ENDPOINT: 'http://rgw.example:7480',
      CAIRN_S3_PREFIX: 'install-a/',
      AWS_REGION: 'default',
    })
    expect(bucket?.name).toBe('cairn-workspaces')
    expect(bucket?.key('sessions/x')).toBe('install-a/sessions/x')
    expect(await bucket?.client.config.region()).toBe('default')
    expect(bucket?.client.config.forcePathStyle).toBe(true)
  })

  it('refuses a bucket name or prefix S3 would not take, typed', () => {
    expect(() => createShippingBucket({ bucket: 'Has Spaces' })).toThrow(CairnProblem)
    expect(() => createShippingBucket({ bucket: 'ok-bucket', prefix: 'no-slash' })).toThrow(
      /must end with \//,
    )
  })
})
