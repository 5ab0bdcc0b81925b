import { execFile, spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync, readdirSync } from 'node:fs'
import { appendFile, chown, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { promisify } from 'node:util'

const run = promisify(execFile)

/** The environment variable through which the test setup tells tests where its PostgreSQL is. */
export const POSTGRES_ADMIN_URL_ENV = 'CAIRN_TEST_POSTGRES_ADMIN_URL'

/** Set by the test command to run the suite on PostgreSQL instead of SQLite. */
export function testsRunOnPostgres(): boolean {
  return process.env.CAIRN_TEST_DATABASE === 'postgres'
}

/** Debian installs each major version's server binaries under /usr/lib/postgresql/<major>/bin. */
export function postgresBinDir(): string {
  const root = '/usr/lib/postgresql'
  const majors = existsSync(root)
    ? readdirSync(root)
        .filter((name) => existsSync(path.join(root, name, 'bin', 'postgres')))
        .sort((a, b) => Number(b) - Number(a))
    : []
  const newest = majors[0]
  if (newest === undefined) throw new Error('PostgreSQL is not installed (apt-get install postgresql)')
  return path.join(root, newest, 'bin')
}

async function freePort(): Promise<number> {
  return await new Promise((resolve, reject) => {
    const server = net.createServer()
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const address = server.address()
      server.close(() => resolve(typeof address === 'object' && address ? address.port : 0))
    })
  })
}

/**
 * A real PostgreSQL cluster of its own: `initdb` in a temp dir, the server on a free loopback port
 * and a socket in that dir, trust authentication for the `postgres` role (the cluster is reachable
 * only from this machine and lives as long as the test run). Runs as the `postgres` system user,
 * since PostgreSQL refuses to run as root.
 */
export class TestPostgres {
  private constructor(
    readonly dir: string,
    readonly port: number,
  ) {}

  /**
   * @param options.listenAddresses where it listens besides 127.0.0.1 (the root namespace's ends
   *   of the cluster harness's veth links); `trustedNetworks` are let in (CIDRs, trust auth).
   */
  static async start(
    options: { listenAddresses?: string[]; trustedNetworks?: string[] } = {},
  ): Promise<TestPostgres> {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-pg-'))
    await chown(dir, ...(await postgresIds()))
    const port = await freePort()
    const pg = new TestPostgres(dir, port)
    const bin = postgresBinDir()
    await pg.asPostgres(path.join(bin, 'initdb'), [
      '-D',
      pg.dataDir,
      '-U',
      'postgres',
      '--auth=trust',
      '--no-sync',
      '-E',
      'UTF8',
      '--locale=C',
    ])
    await writeFile(
      path.join(pg.dataDir, 'postgresql.auto.conf'),
      [
        `port = ${port}`,
        `listen_addresses = '${['127.0.0.1', ...(options.listenAddresses ?? [])].join(',')}'`,
        `unix_socket_directories = '${dir}'`,
        'max_connections = 400',
        'fsync = off',
        'synchronous_commit = off',
        'full_page_writes = off',
        'shared_buffers = 128MB',
        '',
      ].join('\n'),
    )
    await chown(path.join(pg.dataDir, 'postgresql.auto.conf'), ...(await postgresIds()))
    const trusted = (options.trustedNetworks ?? []).map((cidr) => `host all all ${cidr} trust\n`)
    if (trusted.length > 0) await appendFile(path.join(pg.dataDir, 'pg_hba.conf'), trusted.join(''))
    await pg.startServer()
    return pg
  }

  /** Stops a cluster whose `TestPostgres` is gone (its process killed) and deletes it. */
  static async stopLeftover(dir: string): Promise<void> {
    await new TestPostgres(dir, 0).stop()
  }

  get dataDir(): string {
    return path.join(this.dir, 'data')
  }

  /** A URL for `database` as the superuser. */
  url(database = 'postgres', host = '127.0.0.1'): string {
    return `postgres://postgres@${host}:${this.port}/${database}`
  }

  /** A fresh, empty database; its URL. */
  async createDatabase(name = `cairn_${randomBytes(6).toString('hex')}`): Promise<string> {
    await this.sql(`CREATE DATABASE ${name}`)
    return this.url(name)
  }

  /** Runs SQL as the superuser through psql; its unaligned, tuples-only output. */
  async sql(statement: string, database = 'postgres'): Promise<string> {
    const { stdout } = await run(
      path.join(postgresBinDir(), 'psql'),
      [
        '-h',
        '127.0.0.1',
        '-p',
        String(this.port),
        '-U',
        'postgres',
        '-d',
        database,
        '-X',
        '-At',
        '-v',
        'ON_ERROR_STOP=1',
        '-c',
        statement,
      ],
      { env: { ...process.env, PGCONNECT_TIMEOUT: '5' } },
    )
    return stdout.trim()
  }

  /** Ends every client connection to `database` (a dropped connection, as a failover would). */
  async terminateConnections(database: string): Promise<number> {
    const out = await this.sql(
      `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '${database}' AND pid <> pg_backend_pid()`,
    )
    return Number(out)
  }

  /** Stops the server (fast shutdown: clients are disconnected) and starts it again. */
  async restart(): Promise<void> {
    await this.stopServer()
    await this.startServer()
  }

  async stopServer(): Promise<void> {
    await this.asPostgres(path.join(postgresBinDir(), 'pg_ctl'), [
      '-D',
      this.dataDir,
      '-m',
      'fast',
      '-w',
      'stop',
    ]).catch(() => undefined)
  }

  async startServer(): Promise<void> {
    await this.asPostgres(path.join(postgresBinDir(), 'pg_ctl'), [
      '-D',
      this.dataDir,
      '-l',
      path.join(this.dir, 'server.log'),
      '-w',
      '-t',
      '60',
      'start',
    ])
  }

  /**
   * Freezes the server and every backend (SIGSTOP): connections stay open and nothing answers, as
   * when PostgreSQL hangs or the network to it drops packets. `resume` thaws them.
   */
  async pause(): Promise<void> {
    for (const pid of await this.processes()) process.kill(pid, 'SIGSTOP')
  }

  async resume(): Promise<void> {
    for (const pid of await this.processes()) process.kill(pid, 'SIGCONT')
  }

  /** The postmaster and its children (backends, background workers). */
  private async processes(): Promise<number[]> {
    const head = (await readFile(path.join(this.dataDir, 'postmaster.pid'), 'utf8')).split('\n')[0]
    const postmaster = Number(head)
    const { stdout } = await run('pgrep', ['-P', String(postmaster)]).catch(() => ({ stdout: '' }))
    return [postmaster, ...stdout.split('\n').filter(Boolean).map(Number)]
  }

  /** Stops the server and deletes the cluster. */
  async stop(): Promise<void> {
    await this.stopServer()
    await rm(this.dir, { recursive: true, force: true })
  }

  private async asPostgres(command: string, args: string[]): Promise<void> {
    const runuser = spawn('runuser', ['-u', 'postgres', '--', command, ...args], {
      cwd: this.dir,
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: false,
    })
    let output = ''
    runuser.stdout.on('data', (chunk) => {
      output += chunk
    })
    runuser.stderr.on('data', (chunk) => {
      output += chunk
    })
    const code = await new Promise<number | null>((resolve) => {
      runuser.on('close', resolve)
      // A spawn that fails (its cwd gone: the cluster already stopped) never closes.
      runuser.on('error', (error) => {
        output += String(error)
        resolve(-1)
      })
    })
    if (code !== 0) throw new Error(`${path.basename(command)} ${args.join(' ')} failed (${code}): ${output}`)
  }
}

async function postgresIds(): Promise<[number, number]> {
  const { stdout: uid } = await run('id', ['-u', 'postgres'])
  const { stdout: gid } = await run('id', ['-g', 'postgres'])
  return [Number(uid.trim()), Number(gid.trim())]
}

/**
 * The database a test server should use: a fresh PostgreSQL database when the suite runs on
 * PostgreSQL (the cluster started by test/setup/postgres.ts), otherwise undefined (SQLite in the
 * server's data dir, the default).
 */
export async function testDatabaseUrl(): Promise<string | undefined> {
  const admin = process.env[POSTGRES_ADMIN_URL_ENV]
  if (!testsRunOnPostgres() || !admin) return undefined
  const name = `cairn_${randomBytes(6).toString('hex')}`
  await run(path.join(postgresBinDir(), 'psql'), [
    admin,
    '-X',
    '-q',
    '-v',
    'ON_ERROR_STOP=1',
    '-c',
    `CREATE DATABASE ${name}`,
  ])
  const url = new URL(admin)
  url.pathname = `/${name}`
  return url.toString()
}
