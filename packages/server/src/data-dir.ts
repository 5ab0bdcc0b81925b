import { closeSync, existsSync, openSync } from 'node:fs'
import { chmod, lstat, mkdir, readdir, readFile, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { isId, newId } from '@cairn/protocol'

/**
 * The data dir holds the database, the pool image, the secret, admin and CA keys, logs and
 * artifacts: it is the owner's only (0700), and so is everything the server keeps in it (files
 * 0600 or 0700, directories 0700), also on an install made when these were 0755/0644. The pool's
 * own trees (`skip`: the dir driver's store) keep their modes, which the sandboxes rely on.
 */
export async function secureDataDir(dataDir: string, skip: readonly string[] = []): Promise<void> {
  await mkdir(dataDir, { recursive: true, mode: 0o700 })
  const skipped = new Set(skip.map((p) => path.resolve(p)))
  const walk = async (dir: string): Promise<void> => {
    await chmod(dir, 0o700)
    for (const entry of await readdir(dir)) {
      const full = path.join(dir, entry)
      if (skipped.has(full)) continue
      const stat = await lstat(full)
      if (stat.isDirectory()) await walk(full)
      else if (stat.isFile() && (stat.mode & 0o7077) !== 0) await chmod(full, stat.mode & 0o700)
    }
  }
  await walk(path.resolve(dataDir))
}

/** Creates `file` (owner-only) if it does not exist, so SQLite, which gives its WAL the database file's mode, starts owner-only. */
export function createOwnerOnly(file: string): void {
  closeSync(openSync(file, 'a', 0o600))
}

/**
 * The ID of the runtime this data dir holds (its pool, its sandboxes), made on first start and
 * kept in `runtime-id`: sessions record the runtime that owns them, so replicas sharing one
 * database each act on their own.
 */
export async function runtimeIdOf(dataDir: string): Promise<string> {
  const file = path.join(dataDir, 'runtime-id')
  if (existsSync(file)) {
    const id = (await readFile(file, 'utf8')).trim()
    if (!isId('runtime', id)) throw new Error(`${file} does not hold a runtime ID (rt_…): ${id.slice(0, 40)}`)
    return id
  }
  const id = newId('runtime')
  await writeFile(file, `${id}\n`, { mode: 0o600, flag: 'wx' })
  return id
}
