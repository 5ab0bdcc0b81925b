import { execFileSync } from 'node:child_process'
import { readdirSync } from 'node:fs'
import net from 'node:net'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type LocalEgress, startLocalEgress } from '../../../../test/helpers/local-egress.js'
import type { NetworkEvent } from './proxy.js'

/** Sets the descriptor limit back once the closed tunnels' descriptors are free (prlimit needs some). */
async function restoreLimit(limit: number): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    await new Promise((r) => setTimeout(r, 100))
    try {
      execFileSync('prlimit', ['--pid', String(process.pid), `--nofile=${limit}:${limit}`])
      return
    } catch (error) {
      if (attempt >= 50) throw error
    }
  }
}

describe('the egress proxy at the limits of its sandbox and its process', () => {
  let dir = ''
  let upstream: net.Server
  let egress: LocalEgress
  let port = 0
  const events: NetworkEvent[] = []

  beforeAll(async () => {
    // Keeps every connection open and says nothing.
    upstream = net.createServer((socket) => socket.on('error', () => undefined))
    egress = await startLocalEgress(upstream, {
      prefix: 'cairn-egress-limits-',
      options: () => ({ onEvent: (event) => events.push(event), limits: { idleTimeoutMs: 300 } }),
    })
    ;({ dir, port } = egress)
  })

  afterAll(async () => {
    await egress?.close()
  })

  /** Opens a tunnel to up.test; resolves with its socket and the proxy's first answer. */
  function open(): Promise<{ socket: net.Socket; answer: string }> {
    return new Promise((resolve) => {
      const socket = net.connect(path.join(dir, 'egress.sock'))
      let answer = ''
      const done = () => resolve({ socket, answer })
      socket.on('error', done)
      socket.on('close', done)
      socket.on('data', (chunk: Buffer) => {
        answer += chunk.toString('latin1')
        if (answer.includes('\r\n\r\n')) done()
      })
      socket.write(`CONNECT up.test:${port} HTTP/1.1\r\nHost: up.test:${port}\r\n\r\n`)
    })
  }

  it('closes a tunnel on which nothing is sent either way for the idle timeout', async () => {
    const { socket, answer } = await open()
    expect(answer.split('\r\n')[0]).toBe('HTTP/1.1 200 Connection Established')
    // Closed by the proxy (300 ms), long before this test gives up waiting.
    const closed = await new Promise<boolean>((resolve) => {
      socket.once('close', () => resolve(true))
      setTimeout(() => resolve(false), 10_000)
    })
    socket.destroy()
    expect(closed).toBe(true)
  })

  it('answers or closes each connection when the process runs out of descriptors, and lives on', async () => {
    const soft = Number(execFileSync('sh', ['-c', 'ulimit -Hn']).toString())
    const inUse = readdirSync('/proc/self/fd').length
    // Room for a few tunnels (each is four descriptors of this process: client, accepted, upstream
    // and the upstream's end), then EMFILE wherever it falls: accept, connect, or the interface list.
    execFileSync('prlimit', ['--pid', String(process.pid), `--nofile=${inUse + 10}:${soft}`])
    const tunnels: { socket: net.Socket; answer: string }[] = []
    try {
      for (let i = 0; i < 12; i++) tunnels.push(await open())
    } finally {
      for (const { socket } of tunnels) socket.destroy()
      await restoreLimit(soft)
    }
    const statuses = tunnels.map(({ answer }) => answer.split('\r\n')[0] || 'closed')
    expect(statuses).toContain('HTTP/1.1 200 Connection Established')
    expect(statuses.filter((s) => s !== 'HTTP/1.1 200 Connection Established').length).toBeGreaterThan(0)
    for (const status of statuses)
      expect(status).toMatch(
        /^(HTTP\/1\.1 200 Connection Established|HTTP\/1\.1 503 Service Unavailable|closed)$/,
      )
    // With descriptors again, the proxy serves as before.
    const after = await open()
    expect(after.answer.split('\r\n')[0]).toBe('HTTP/1.1 200 Connection Established')
    after.socket.destroy()
  })
})
