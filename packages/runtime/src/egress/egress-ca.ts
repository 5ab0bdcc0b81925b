import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { chmod, mkdir, readFile, rename } from 'node:fs/promises'
import net from 'node:net'
import path from 'node:path'
import tls from 'node:tls'
import { CairnProblem } from '@cairn/protocol'
import { makeCaCertificate, signCertificate } from '../tls/openssl-certificates.js'

const CA_DAYS = 3650
/** Leaf certificates live in memory only; a short validity keeps a leaked one of little use. */
const LEAF_DAYS = 7
const LEAF_REFRESH_MS = (LEAF_DAYS / 2) * 24 * 60 * 60 * 1000

/**
 * The per-install certificate authority the egress proxy signs host certificates with, so it can
 * terminate TLS towards hosts bound to a `proxy` secret. Made once with the `openssl` CLI; the key
 * stays 0600 in the data dir, only the certificate is shown to sandboxes.
 */
export class EgressCa {
  private readonly leaves = new Map<string, { context: Promise<tls.SecureContext>; madeAtMs: number }>()

  private constructor(
    private readonly dir: string,
    /** PEM of the CA certificate (what sandboxes trust). */
    readonly certificatePem: string,
  ) {}

  static async load(dir: string): Promise<EgressCa> {
    await mkdir(dir, { recursive: true, mode: 0o700 })
    await chmod(dir, 0o700)
    const keyFile = path.join(dir, 'ca.key')
    const certFile = path.join(dir, 'ca.pem')
    if (!existsSync(keyFile) || !existsSync(certFile)) {
      const tag = randomBytes(4).toString('hex')
      // Written beside, then renamed: a crash half-way must not leave a key without its certificate.
      await makeCaCertificate({
        keyFile: `${keyFile}.new`,
        certFile: `${certFile}.new`,
        subject: `/O=Cairn/CN=Cairn egress CA ${tag}`,
        days: CA_DAYS,
      })
      await chmod(`${keyFile}.new`, 0o600)
      await rename(`${keyFile}.new`, keyFile)
      await rename(`${certFile}.new`, certFile)
    }
    await chmod(keyFile, 0o600)
    await chmod(certFile, 0o600)
    return new EgressCa(dir, await readFile(certFile, 'utf8'))
  }

  /** A TLS context presenting a certificate for `host`, signed on first use and then cached. */
  contextFor(host: string): Promise<tls.SecureContext> {
    const key = host.toLowerCase()
    const cached = this.leaves.get(key)
    // Re-signed half-way through its validity, so a long-running server never presents an expired one.
    if (cached && Date.now() - cached.madeAtMs < LEAF_REFRESH_MS) return cached.context
    const context = this.signLeaf(key)
    const entry = { context, madeAtMs: Date.now() }
    // A failed signing is not cached: the next connection tries again.
    context.catch(() => {
      if (this.leaves.get(key) === entry) this.leaves.delete(key)
    })
    this.leaves.set(key, entry)
    return context
  }

  private async signLeaf(host: string): Promise<tls.SecureContext> {
    // The name goes into an openssl subject: nothing but a plain DNS name or an IP address.
    if (!net.isIP(host) && !/^[a-z0-9_-]+(\.[a-z0-9_-]+)*$/.test(host)) {
      throw new CairnProblem('validation_failed', `cannot issue a certificate for '${host}'`)
    }
    const san = net.isIP(host) ? `IP:${host}` : `DNS:${host}`
    const { keyPem, certPem } = await signCertificate({
      caCertFile: path.join(this.dir, 'ca.pem'),
      caKeyFile: path.join(this.dir, 'ca.key'),
      subject: `/CN=${host}`,
      days: LEAF_DAYS,
      extensions: [`subjectAltName=${san}`, 'extendedKeyUsage=serverAuth'],
      workIn: this.dir,
    })
    return tls.createSecureContext({ key: keyPem, cert: `${certPem}${this.certificatePem}` })
  }
}
