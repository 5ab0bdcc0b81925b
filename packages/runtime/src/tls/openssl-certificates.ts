import { generateKeyPairSync } from 'node:crypto'
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { execTool } from '../util/exec.js'

/**
 * Certificates made with the `openssl` CLI (one way for the whole runtime: the egress CA, the
 * cluster CA and their leaves). Keys are EC P-256.
 */

/** A new self-signed CA: its key and certificate, written to the files named (the caller sets their modes). */
export async function makeCaCertificate(options: {
  keyFile: string
  certFile: string
  /** An openssl subject (`/O=Cairn/CN=…`). */
  subject: string
  days: number
}): Promise<void> {
  await execTool(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:prime256v1',
      '-nodes',
      '-keyout',
      options.keyFile,
      '-out',
      options.certFile,
      '-days',
      String(options.days),
      '-subj',
      options.subject,
      '-addext',
      'basicConstraints=critical,CA:TRUE,pathlen:0',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    ],
    { code: 'internal' },
  )
}

/** A new key pair and its certificate signed by the CA in `caCertFile`/`caKeyFile`, as PEM texts. */
export async function signCertificate(options: {
  caCertFile: string
  caKeyFile: string
  subject: string
  days: number
  /** `-addext` values (`subjectAltName=…`, `extendedKeyUsage=…`). */
  extensions: readonly string[]
  /** A private directory for the work files (removed after). */
  workIn: string
}): Promise<{ keyPem: string; certPem: string }> {
  const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'prime256v1' })
  const keyPem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString()
  const work = await mkdtemp(path.join(options.workIn, 'leaf-'))
  try {
    const keyFile = path.join(work, 'leaf.key')
    const certFile = path.join(work, 'leaf.pem')
    await writeFile(keyFile, keyPem, { mode: 0o600 })
    await execTool(
      'openssl',
      [
        'req',
        '-x509',
        '-new',
        '-key',
        keyFile,
        '-CA',
        options.caCertFile,
        '-CAkey',
        options.caKeyFile,
        '-subj',
        options.subject,
        '-days',
        String(options.days),
        '-addext',
        'basicConstraints=critical,CA:FALSE',
        ...options.extensions.flatMap((extension) => ['-addext', extension]),
        '-out',
        certFile,
      ],
      { code: 'internal' },
    )
    return { keyPem, certPem: await readFile(certFile, 'utf8') }
  } finally {
    await rm(work, { recursive: true, force: true })
  }
}
