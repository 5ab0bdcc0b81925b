import { existsSync } from 'node:fs'
import { mkdir, readFile, rename, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { CairnProblem } from '@cairn/protocol'
import type { Db } from './database.js'
import { NODE_SHARED_FILES_VIEW } from './node-role.js'

/**
 * Files every API replica must hold the same copy of (the secrets key, the egress CA), kept in the
 * shared database. Each replica writes the database's copy into its own data dir before using
 * it; the first replica to start makes it (a race between two keeps one: the first insert).
 */
export class SharedFiles {
  /**
   * @param options.node a node's copy: read through the view its role may read (the egress CA
   *   only, never the secrets key), and never stored (an API replica stores the first copy).
   */
  constructor(
    private readonly db: Db,
    private readonly now: () => string,
    private readonly options: { node?: boolean } = {},
  ) {}

  /**
   * Makes `files` (under `dir`, stored as one entry `name`, so a key never meets another
   * replica's certificate) the database's copy. Without one, the local files are stored, made
   * first by `create` when missing; a copy already stored is written over the local files.
   */
  async sync(
    name: string,
    dir: string,
    files: readonly string[],
    create: () => Promise<void>,
  ): Promise<void> {
    let stored = await this.read(name)
    if (!stored && this.options.node)
      throw new CairnProblem(
        'unavailable',
        `the cluster database holds no ${name} yet: start an API replica first (it stores the cluster's copy)`,
      )
    if (!stored) {
      if (!files.every((file) => existsSync(path.join(dir, file)))) await create()
      const local: Record<string, string> = {}
      for (const file of files) local[file] = (await readFile(path.join(dir, file))).toString('base64')
      await this.db.q
        .insertInto('shared_files')
        .values({ name, content: Buffer.from(JSON.stringify(local)), created_at: this.now() })
        .onConflict((oc) => oc.column('name').doNothing())
        .execute()
      stored = await this.read(name)
      if (!stored) throw new Error(`shared file ${name} was not stored`)
    }
    await mkdir(dir, { recursive: true, mode: 0o700 })
    for (const file of files) {
      const content = Buffer.from(stored[file] ?? '', 'base64')
      const target = path.join(dir, file)
      if (existsSync(target) && (await readFile(target)).equals(content)) continue
      // Beside, then renamed: a reader never meets half a key.
      await writeFile(`${target}.shared`, content, { mode: 0o600 })
      await rename(`${target}.shared`, target)
    }
  }

  private async read(name: string): Promise<Record<string, string> | undefined> {
    const row = await this.db.q
      .selectFrom(this.options.node ? NODE_SHARED_FILES_VIEW : 'shared_files')
      .select('content')
      .where('name', '=', name)
      .executeTakeFirst()
    return row ? (JSON.parse(row.content.toString('utf8')) as Record<string, string>) : undefined
  }
}
