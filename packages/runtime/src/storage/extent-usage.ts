import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { CairnProblem } from '@cairn/protocol'
import type { TreeSizes } from './pool.js'

const run = promisify(execFile)

/**
 * Walks a tree by file descriptors (every directory opened with O_NOFOLLOW beneath its parent's
 * descriptor, so an agent swapping a directory for a link to another tree cannot send the walk
 * there) and sums each regular file's extents with FIEMAP (synced first): all of them as
 * referenced bytes, those not marked shared as exclusive bytes. Hard-linked files count once.
 * Only regular files are opened (O_NONBLOCK, checked with fstat): FIFOs and devices never are.
 * The figures are `btrfs filesystem du`'s, without its walk by path names.
 */
const SIZER = String.raw`import fcntl, os, stat, struct, sys
FIEMAP, COUNT, EXTENT = 0xC020660B, 256, 56
LAST, SHARED = 0x1, 0x2000
DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
total = exclusive = 0
seen = set()
def extents(fd):
    global total, exclusive
    start = 0
    while True:
        buf = bytearray(struct.pack("=QQLLLL", start, 0xFFFFFFFFFFFFFFFF, 1, 0, COUNT, 0)) + bytearray(EXTENT * COUNT)
        fcntl.ioctl(fd, FIEMAP, buf)
        mapped = struct.unpack_from("=L", buf, 20)[0]
        if mapped == 0:
            return
        for i in range(mapped):
            logical, _, length = struct.unpack_from("=QQQ", buf, 32 + EXTENT * i)
            flags = struct.unpack_from("=L", buf, 32 + EXTENT * i + 40)[0]
            total += length
            if not flags & SHARED:
                exclusive += length
            start = logical + length
            if flags & LAST:
                return
stack = [os.open(os.fsencode(sys.argv[1]), DIR)]
while stack:
    fd = stack.pop()
    with os.scandir(fd) as it:
        names = [e.name for e in it]
    for name in names:
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                stack.append(os.open(name, DIR, dir_fd=fd))
            elif stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                child = os.open(name, FILE, dir_fd=fd)
                try:
                    if stat.S_ISREG(os.fstat(child).st_mode):
                        extents(child)
                finally:
                    os.close(child)
        except OSError:
            pass  # changed meanwhile: a live tree's figure is a moment's
    os.close(fd)
print(total, exclusive)
`

/** Referenced and exclusive bytes of the tree at `dir` (see SIZER). */
export async function extentUsage(dir: string): Promise<TreeSizes> {
  try {
    const { stdout } = await run('python3', ['-I', '-S', '-c', SIZER, dir], {
      env: { PATH: '/usr/bin:/bin' },
      timeout: 10 * 60_000,
      killSignal: 'SIGKILL',
      maxBuffer: 1024 * 1024,
    })
    const [referencedBytes = 0, exclusiveBytes = 0] = stdout.trim().split(/\s+/).map(Number)
    return { referencedBytes, exclusiveBytes }
  } catch (error) {
    const detail = String((error as { stderr?: unknown }).stderr ?? (error as Error).message).trim()
    throw new CairnProblem('storage_error', `measuring ${dir} failed: ${detail.split('\n').pop()}`)
  }
}
