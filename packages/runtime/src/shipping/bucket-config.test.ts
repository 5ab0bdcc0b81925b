import net from 'node:net'
import { CairnProblem } from '@cairn/protocol'
import { describe, expect, it } from 'vitest'
import { rejection, within } from '../../test/settled.js'
import { bucketCallBoundMs } from './bucket-bounds.js'
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

describe('a store that trickles (a byte every 200 ms: never idle, never done)', () => {
  it('fails a write (its answer trickled) and a read (its body trickled) shipping_failed within their deadline', async () => {
    // The idle timeout never fires on a store that sends a byte now and then: a write whose
    // answer came a byte at a time, and a read whose 1,000-byte body did, waited for minutes.
    const store = await startTricklingStore(200)
    const idleTimeoutMs = 500
    const connectTimeoutMs = 500
    Object.assign(process.env, { AWS_ACCESS_KEY_ID: 'trickle', AWS_SECRET_ACCESS_KEY: 'trickle-secret' })
    const bucket = createShippingBucket({
      bucket: 'cairn-shipping',
      endpoint: store.url,
      region: 'default',
      idleTimeoutMs,
      connectTimeoutMs,
    })
    // Its bound (4.5 s here) plus its bytes at 256 KiB/s (well under a second for these); the
    // liveness bound leaves room for a loaded machine.
    const boundMs = bucketCallBoundMs(idleTimeoutMs, connectTimeoutMs) + 10_000
    try {
      const [written, read] = await Promise.all([
        rejection(within(bucket.putOnce('sessions/x/000001', Buffer.alloc(1024)), boundMs)),
        rejection(within(bucket.get('sessions/x/chain/000001', 1024 * 1024), boundMs)),
      ])
      for (const error of [written, read]) {
        expect(error.code, error.message).toBe('shipping_failed')
        expect(error.status).toBe(503)
        expect(error.message).toContain('deadline')
      }
    } finally {
      await store.close()
      delete process.env.AWS_ACCESS_KEY_ID
      delete process.env.AWS_SECRET_ACCESS_KEY
    }
  })
})

/**
 * An HTTP server that answers a PUT with headers a byte at a time, without end, and a GET with a
 * 1,000-byte body a byte at a time (after its headers, at once).
 */
async function startTricklingStore(everyMs: number): Promise<{ url: string; close(): Promise<void> }> {
  const sockets = new Set<net.Socket>()
  const timers = new Set<NodeJS.Timeout>()
  const trickle = (socket: net.Socket, byte: string) => {
    const timer = setInterval(() => socket.write(byte), everyMs)
    timers.add(timer)
    socket.once('close', () => clearInterval(timer))
  }
  const server = net.createServer((socket) => {
    sockets.add(socket)
    socket.on('error', () => undefined)
    socket.once('close', () => sockets.delete(socket))
    socket.once('data', (data) => {
      if (data.toString('latin1').startsWith('GET ')) {
        socket.write(
          'HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: 1000\r\n\r\n',
        )
        trickle(socket, 'x')
      } else {
        socket.write('HTTP/1.1 200 OK\r\nx-slow: ')
        trickle(socket, 'a')
      }
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as net.AddressInfo
  return {
    url: `http://127.0.0.1:${port}`,
    close: async () => {
      for (const timer of timers) clearInterval(timer)
      for (const socket of sockets) socket.destroy()
      await new Promise((resolve) => server.close(resolve))
    },
  }
}
