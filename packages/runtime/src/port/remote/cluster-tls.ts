import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { chmod, mkdir, readFile, rename, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import { makeCaCertificate, signCertificate } from '../../tls/openssl-certificates.js'

/** A cluster process's TLS material, PEM texts: the cluster CA, its own certificate and key. */
export interface ClusterTls {
  ca: string
  cert: string
  key: string
}

export type ClusterRole = 'api' | 'node'

/** The identity a role's certificate carries (its CN): a node serves only `cairn-api` clients. */
export const CLUSTER_ROLE_NAMES = { api: 'cairn-api', node: 'cairn-node' } as const satisfies Record<
  ClusterRole,
  string
>

const CA_DAYS = 3650
const LEAF_DAYS = 825

/** Reads the role's certificate and key and the CA from a directory `cairn cluster init` wrote. */
export async function loadClusterTls(dir: string, role: ClusterRole): Promise<ClusterTls> {
  const files = { ca: 'ca.pem', cert: `${role}.pem`, key: `${role}-key.pem` }
  const missing = Object.values(files).filter((name) => !existsSync(path.join(dir, name)))
  if (missing.length > 0)
    throw new CairnProblem(
      'bad_request',
      `the cluster directory ${dir} lacks ${missing.join(', ')}: write it with \`cairn cluster init --dir ${dir}\``,
    )
  const read = (name: string) => readFile(path.join(dir, name), 'utf8')
  return { ca: await read(files.ca), cert: await read(files.cert), key: await read(files.key) }
}

/**
 * Writes a new cluster CA and one certificate per role into `dir` (all PEM, keys 0600):
 * `ca.pem`, `ca-key.pem`, `api.pem`, `api-key.pem`, `node.pem`, `node-key.pem`. Refuses a
 * directory that holds a CA already (`conflict`): a second CA would split the cluster.
 */
export async function initClusterTls(dir: string): Promise<string[]> {
  await mkdir(dir, { recursive: true, mode: 0o700 })
  await chmod(dir, 0o700)
  const caFile = path.join(dir, 'ca.pem')
  const caKeyFile = path.join(dir, 'ca-key.pem')
  if (existsSync(caFile) || existsSync(caKeyFile))
    throw new CairnProblem('conflict', `${dir} holds a cluster CA already (ca.pem): remove it to start over`)
  const tag = randomBytes(4).toString('hex')
  await makeCaCertificate({
    keyFile: `${caKeyFile}.new`,
    certFile: `${caFile}.new`,
    subject: `/O=Cairn/CN=Cairn cluster CA ${tag}`,
    days: CA_DAYS,
  })
  await chmod(`${caKeyFile}.new`, 0o600)
  await rename(`${caKeyFile}.new`, caKeyFile)
  await rename(`${caFile}.new`, caFile)
  const written = [caFile, caKeyFile]
  for (const role of ['api', 'node'] as const) {
    const { keyPem, certPem } = await signCertificate({
      caCertFile: caFile,
      caKeyFile,
      subject: `/O=Cairn/CN=${CLUSTER_ROLE_NAMES[role]}`,
      days: LEAF_DAYS,
      extensions: [`extendedKeyUsage=${role === 'api' ? 'clientAuth' : 'serverAuth'}`],
      workIn: dir,
    })
    const keyFile = path.join(dir, `${role}-key.pem`)
    const certFile = path.join(dir, `${role}.pem`)
    await writeFile(keyFile, keyPem, { mode: 0o600 })
    await writeFile(certFile, certPem, { mode: 0o644 })
    written.push(certFile, keyFile)
  }
  return written
}
