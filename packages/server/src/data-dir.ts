import { closeSync, openSync } from 'node:fs'
import { chmod, lstat, mkdir, readdir } from 'node:fs/promises'
import path from 'node:path'

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
