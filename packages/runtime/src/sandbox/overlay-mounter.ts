import { LineHelper } from '../util/line-helper.js'
import { LAUNCHER_MOUNT_NS } from './launcher-mount-ns.js'

/**
 * Writable roots that reset: for a sandbox with an image, a tmpfs of its own (sized by the
 * sandbox's memory limit, whose cgroup its pages are charged to) holding the upper and work
 * directories of an overlay whose lower layer is the image's read-only root. Whatever the sandbox
 * changes in its root lands in that tmpfs and is gone when the sandbox is: the next cold start
 * sees the image as built. One long-lived root helper (python3), as for idmapped mounts, which
 * mounts them in the sandbox's launcher's mount namespace, never in the host's
 * (launcher-mount-ns.ts): about 0.2 ms a mount against a few ms for `mount(8)`.
 *
 * Request: `<id> mount <pid> <base> <dir> <lower> <sizeMiB>`; the overlay is at `<dir>/root`.
 */
const HELPER = `${LAUNCHER_MOUNT_NS}
def make(d, lower, size_mib):
    os.makedirs(d, 0o711, exist_ok=True)
    mount("cairn-root", d, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0711,size=%dm" % size_mib)
    for name, mode in (("upper", 0o755), ("work", 0o700), ("root", 0o755)):
        os.mkdir(os.path.join(d, name), mode)
    opts = "lowerdir=%s,upperdir=%s/upper,workdir=%s/work" % (lower, d, d)
    mount("cairn-root", os.path.join(d, "root"), "overlay", MS_NOSUID | MS_NODEV, opts)

for line in sys.stdin:
    fields = line.rstrip("\\n").split("\\t")
    try:
        if fields[1] != "mount":
            raise ValueError("unknown request " + fields[1])
        with launcher_ns(int(fields[2]), fields[3]):
            make(fields[4], fields[5], int(fields[6]))
        print(fields[0] + "\\tok", flush=True)
    except Exception as e:
        print(fields[0] + "\\t" + str(e).replace("\\n", " "), flush=True)
`

export class OverlayMounter {
  private readonly helper = new LineHelper(HELPER, 'writable root')

  /**
   * In the mount namespace of process `pid` (a launcher that has unshared its own), over a fresh
   * tmpfs at `base`: a tmpfs at `dir` (below `base`) and the overlay of `lower` at `<dir>/root`,
   * which it returns. They go with that namespace.
   */
  async mountIn(pid: number, base: string, dir: string, lower: string, sizeMiB: number): Promise<string> {
    await this.helper.request(['mount', pid, base, dir, lower, Math.max(16, Math.floor(sizeMiB))])
    return `${dir}/root`
  }

  close(): void {
    this.helper.close()
  }
}
