import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { Writable } from 'node:stream'
import { describe, expect, it } from 'vitest'
import { type DrainEnd, drained } from './drained.js'

/** A writable that takes nothing until `release`: one write fills it (its high-water mark is 1). */
function held() {
  let pending: (() => void) | undefined
  const stream = new Writable({
    highWaterMark: 1,
    write(_chunk, _encoding, callback) {
      pending = () => callback()
    },
  })
  stream.on('error', () => undefined)
  return {
    stream,
    release: () => pending?.(),
    fill: () => expect(stream.write('x')).toBe(false),
  }
}

/** What happens to a full writable, and when: before the wait begins or while it waits. */
const EDGES: {
  name: string
  when: 'before' | 'during'
  act: (w: ReturnType<typeof held>) => void
  expected: DrainEnd
}[] = [
  { name: 'destroyed', when: 'before', act: (w) => w.stream.destroy(), expected: 'closed' },
  { name: 'destroyed', when: 'during', act: (w) => w.stream.destroy(), expected: 'closed' },
  { name: 'failed', when: 'during', act: (w) => w.stream.destroy(new Error('EPIPE')), expected: 'errored' },
  { name: 'drained', when: 'during', act: (w) => w.release(), expected: 'drained' },
  {
    // An ended writable finishes and closes without a drain.
    name: 'ended and finished',
    when: 'during',
    act: (w) => {
      w.stream.end()
      w.release()
    },
    expected: 'closed',
  },
]

describe('drained', () => {
  it.each(EDGES)('ends when the writable is $name $when the wait', async ({ when, act, expected }) => {
    const w = held()
    w.fill()
    if (when === 'before') act(w)
    const wait = drained(w.stream)
    if (when === 'during') setImmediate(() => act(w))
    expect(await wait).toBe(expected)
    // Nothing of the wait is left on the writable.
    expect(w.stream.listenerCount('drain')).toBe(0)
    expect(w.stream.listenerCount('close')).toBe(0)
    expect(w.stream.listenerCount('error')).toBe(1)
  })

  it('answers at once for a writable that needs no drain', async () => {
    const w = held()
    expect(await drained(w.stream)).toBe('drained')
  })

  it('ends when `until` settles, and destroys a writable stalled past its bound', async () => {
    const a = held()
    a.fill()
    expect(await drained(a.stream, { until: Promise.reject(new Error('exited')) })).toBe('ended')
    expect(a.stream.destroyed).toBe(false)
    const b = held()
    b.fill()
    expect(await drained(b.stream, { stallMs: 20 })).toBe('stalled')
    expect(b.stream.destroyed).toBe(true)
  })

  it('ends when an HTTP client goes away in the middle of a response it does not read', async () => {
    const ended = new Promise<DrainEnd>((resolve) => {
      const server = http.createServer((_request, res) => {
        res.writeHead(200)
        while (res.write(Buffer.alloc(64 * 1024))) {
          /* until the socket is full */
        }
        const wait = drained(res)
        // The client reads nothing and goes.
        _request.socket.resetAndDestroy()
        void wait.then((end) => {
          server.close()
          resolve(end)
        })
      })
      server.listen(0, '127.0.0.1', () => {
        const request = http.get({ port: (server.address() as AddressInfo).port, host: '127.0.0.1' })
        request.on('response', (response) => response.pause())
        request.on('error', () => undefined)
      })
    })
    expect(await ended).toBe('closed')
  })
})
