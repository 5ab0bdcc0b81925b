import { CreateBucketCommand, GetObjectCommand, PutObjectCommand } from '@aws-sdk/client-s3'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startObjectStore, type TestObjectStore } from '../helpers/rgw.js'

// The object store the cluster ships workspaces to must refuse to overwrite: a shipped increment is
// written once, with If-None-Match: *, and a second writer (a stale node) must fail, not replace it.
// Fake S3 servers ignore the condition; this is the real one.
describe('Ceph RGW as the test object store', () => {
  let store: TestObjectStore
  beforeAll(async () => {
    store = await startObjectStore()
  }, 600_000)
  afterAll(async () => {
    await store?.stop()
  })

  it('honours conditional writes: the second If-None-Match: * put of a key fails with 412', async () => {
    const s3 = store.client()
    await s3.send(new CreateBucketCommand({ Bucket: 'cairn-conditional' }))
    const put = (body: string) =>
      s3.send(
        new PutObjectCommand({
          Bucket: 'cairn-conditional',
          Key: 'increments/1',
          Body: body,
          IfNoneMatch: '*',
        }),
      )
    await put('first writer')
    const second = await put('stale writer').then(
      () => undefined,
      (error: { $metadata?: { httpStatusCode?: number } }) => error,
    )
    expect(second?.$metadata?.httpStatusCode).toBe(412)
    const got = await s3.send(new GetObjectCommand({ Bucket: 'cairn-conditional', Key: 'increments/1' }))
    expect(await got.Body?.transformToString()).toBe('first writer')
  })
})
