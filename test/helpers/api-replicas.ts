import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { type RunningServer, startServer } from '@cairn/server'
import { initClusterTls } from '../../packages/runtime/src/port/remote/cluster-tls.js'
import { type RunningNode, startNode } from '../../packages/server/src/node/start-node.js'
import { nodeDatabaseUrl } from './node-role.js'
import { TestPostgres } from './postgres.js'
import { Api } from './server.js'

/** API replicas (`--role api`) on one PostgreSQL of their own, in front of one runtime node. */
export interface ApiReplicas {
  databaseUrl: string
  replicas: RunningServer[]
  /** The install's admin key (made by the first replica). */
  adminKey: string
  /** An admin client of replica `i`. */
  api(i: number): Api
  close(): Promise<void>
}

export async function startApiReplicas(count: number, tag: string): Promise<ApiReplicas> {
  const dirs: string[] = []
  const tempDir = async (what: string) => {
    const dir = await mkdtemp(path.join(os.tmpdir(), `cairn-${tag}-${what}-`))
    dirs.push(dir)
    return dir
  }
  const postgres = await TestPostgres.start()
  const replicas: RunningServer[] = []
  let node: RunningNode | undefined
  const close = async () => {
    for (const r of replicas) await r.close().catch(() => undefined)
    await node?.close().catch(() => undefined)
    await postgres.stop()
    for (const dir of dirs) await rm(dir, { recursive: true, force: true })
  }
  try {
    const databaseUrl = await postgres.createDatabase()
    const clusterDir = await tempDir('tls')
    await initClusterTls(clusterDir)
    node = await startNode({
      dataDir: await tempDir('node'),
      clusterDir,
      database: await nodeDatabaseUrl(postgres, databaseUrl, { role: 'cairn_node_a' }),
      listen: '127.0.0.1:0',
      name: 'node-a',
      poolImageSizeBytes: 1024 * 1024 * 1024,
      logLevel: 'error',
    })
    // One after the other: the later ones find the install (its admin key) in the database.
    for (let i = 0; i < count; i++)
      replicas.push(
        await startServer({
          role: 'api',
          dataDir: await tempDir(`api-${i}`),
          database: databaseUrl,
          clusterDir,
          port: 0,
          writeCredentials: false,
          logLevel: 'error',
        }),
      )
    const adminKey = replicas[0]?.adminKey ?? ''
    return {
      databaseUrl,
      replicas,
      adminKey,
      api: (i) => new Api(replicas[i]?.url ?? '', adminKey),
      close,
    }
  } catch (error) {
    await close()
    throw error
  }
}
