import { execFile } from 'node:child_process'
import { rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { findBinary } from './runsc.js'

/**
 * gVisor releases before 2023 (Debian 12 ships 20221219) refuse `statx` with AT_NO_AUTOMOUNT
 * (EINVAL), the flag coreutils 9 passes: `ls -l` and `stat` fail on every file. A preloaded shim
 * clears the flag (gVisor has no automounts, so it changes nothing else). It is compiled once per
 * instance and loaded through the sandbox root's /etc/ld.so.preload, so the environment stays
 * exactly the bwrap driver's.
 */
const SHIM_SOURCE = `#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
  return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}
`

/** In-sandbox path of the shim, inside the driver's own read-only root. */
export const STATX_SHIM_PATH = '/etc/cairn-gvisor/statx-fix.so'
/** The preload list glibc's loader reads at every exec. */
export const STATX_PRELOAD_PATH = '/etc/ld.so.preload'

/**
 * Compiles the shim into `<rootfsDir>/etc/cairn-gvisor/` and lists it in the root's
 * /etc/ld.so.preload. Returns false (and leaves no preload) when no C compiler is installed.
 */
export async function installStatxShim(rootfsDir: string): Promise<boolean> {
  const cc = findBinary('cc') ?? findBinary('gcc')
  const preload = path.join(rootfsDir, STATX_PRELOAD_PATH)
  const target = path.join(rootfsDir, STATX_SHIM_PATH)
  if (!cc) {
    await rm(preload, { force: true })
    return false
  }
  const source = `${target}.c`
  await writeFile(source, SHIM_SOURCE, { mode: 0o644 })
  const ok = await new Promise<boolean>((resolve) => {
    execFile(cc, ['-shared', '-fPIC', '-O2', '-o', target, source], { timeout: 60_000 }, (error) =>
      resolve(!error),
    )
  })
  await rm(source, { force: true })
  if (ok) await writeFile(preload, `${STATX_SHIM_PATH}\n`, { mode: 0o644 })
  else await rm(preload, { force: true })
  return ok
}
