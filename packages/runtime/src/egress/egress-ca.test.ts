import { statSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import type { AddressInfo } from 'node:net'
import os from 'node:os'
import path from 'node:path'
import tls from 'node:tls'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { EgressCa } from './egress-ca.js'

let dir = ''

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-egress-ca-'))
})

afterAll(async () => {
  await rm(dir, { recursive: true, force: true })
})

/** Completes a TLS handshake against a server presenting `context`, trusting only `caPem`. */
async function handshake(context: tls.SecureContext, caPem: string, servername: string): Promise<string> {
  const server = tls.createServer({ SNICallback: (_name, done) => done(null, context) }, (socket) =>
    socket.end('hello'),
  )
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  try {
    return await new Promise<string>((resolve, reject) => {
      const socket = tls.connect({
        host: '127.0.0.1',
        port: (server.address() as AddressInfo).port,
        servername,
        ca: caPem,
      })
      let data = ''
      socket.on('data', (chunk) => {
        data += chunk
      })
      socket.on('end', () => resolve(data))
      socket.on('error', reject)
    })
  } finally {
    server.close()
  }
}

describe('egress CA', () => {
  it('is made once, keeps its key owner-only and signs host certificates clients accept', async () => {
    const ca = await EgressCa.load(path.join(dir, 'ca'))
    expect(statSync(path.join(dir, 'ca', 'ca.key')).mode & 0o777).toBe(0o600)
    expect(ca.certificatePem).toContain('BEGIN CERTIFICATE')
    const again = await EgressCa.load(path.join(dir, 'ca'))
    expect(again.certificatePem).toBe(ca.certificatePem)

    const context = ca.contextFor('api.example.test')
    expect(ca.contextFor('API.example.test')).toBe(context)
    expect(await handshake(await context, ca.certificatePem, 'api.example.test')).toBe('hello')
    // The certificate names its host only.
    await expect(handshake(await context, ca.certificatePem, 'other.example.test')).rejects.toThrow(
      /altnames|does not match/i,
    )
    // Not trusted by anyone who does not trust this CA.
    await expect(
      handshake(await context, tls.rootCertificates.join('\n'), 'api.example.test'),
    ).rejects.toThrow()
    await expect(ca.contextFor('evil/CN=x')).rejects.toThrow(/cannot issue/)
  })
})
