import { LineHelper } from '../util/line-helper.js'
import { LAUNCHER_MOUNT_NS } from './launcher-mount-ns.js'

/**
 * Idmapped mounts for the bwrap driver's per-sandbox host uids (see `SandboxUids`): files stay on
 * disk as the shared sandbox uid, and each sandbox sees its workspace and binds through a mount that
 * shows them as its own uid. One long-lived root helper (python3, which every sandbox host has),
 * which mounts them in the sandbox's launcher's mount namespace, never in the host's
 * (launcher-mount-ns.ts).
 *
 * Why a helper user namespace: `mount_setattr(MOUNT_ATTR_IDMAP)` takes the idmap from a user
 * namespace, refuses the initial one (EPERM: it maps every id to itself, nothing to do) and needs a
 * namespace the caller is privileged over. The helper makes one per host uid (a child process
 * that `unshare(CLONE_NEWUSER)`s, whose maps the helper writes as root: disk uid → sandbox uid),
 * keeps its descriptor (the child exits; the namespace lives on), and reuses it whenever that uid
 * comes back. The mount itself is a detached clone (`open_tree(OPEN_TREE_CLONE)`, its source
 * looked up in the host's namespace): only a mount no one sees yet may take an idmap. It is then
 * moved into place inside the launcher's namespace. About 0.25 ms per mount here; the user
 * namespace, once per uid, 4–10 ms.
 *
 * Requests, one per line, tab-separated: `<id> check <source> <diskUid> <diskGid> <uid> <gid>` (an
 * idmapped clone made and dropped, never attached), `<id> mount <pid> <base> <diskUid> <diskGid>
 * <uid> <gid>` followed by `<source> <point> <ro 0|1>` for each mount; answers `<id>\tok` or
 * `<id>\t<error>`.
 */
const HELPER = `${LAUNCHER_MOUNT_NS}
CLONE_NEWUSER = 0x10000000
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_EMPTY_PATH, AT_FDCWD = 1, 0x80000, 0x1000, -100
MOVE_MOUNT_F_EMPTY_PATH = 4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_IDMAP = 1, 2, 4, 0x00100000
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
namespaces = {}

def userns(disk_uid, disk_gid, uid, gid):
    key = (disk_uid, disk_gid, uid, gid)
    if key in namespaces:
        return namespaces[key]
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.close(ready_r)
        if libc.unshare(CLONE_NEWUSER) != 0:
            os._exit(1)
        os.write(ready_w, b"x")
        os.read(go_r, 1)
        os._exit(0)
    os.close(go_r)
    os.close(ready_w)
    try:
        if os.read(ready_r, 1) != b"x":
            raise OSError(1, "the user namespace helper failed")
        with open("/proc/%d/uid_map" % pid, "w") as f:
            f.write("%d %d 1" % (disk_uid, uid))
        with open("/proc/%d/gid_map" % pid, "w") as f:
            f.write("%d %d 1" % (disk_gid, gid))
        fd = os.open("/proc/%d/ns/user" % pid, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(go_w)
        os.waitpid(pid, 0)
    namespaces[key] = fd
    return fd

def idmapped(source, ids, ro):
    ns = userns(*ids)
    tree = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, source.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)
    if tree < 0:
        fail("open_tree")
    flags = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_RDONLY if ro else 0)
    attr = (ctypes.c_uint64 * 4)(flags, 0, 0, ns)
    if libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, ctypes.byref(attr), 32) < 0:
        os.close(tree)
        fail("mount_setattr")
    return tree

def mount_in(pid, base, ids, specs):
    trees = []
    try:
        for source, point, ro in specs:
            trees.append((idmapped(source, ids, ro == "1"), point))
        with launcher_ns(pid, base):
            for tree, point in trees:
                os.makedirs(point, 0o711, exist_ok=True)
                if libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, point.encode(), MOVE_MOUNT_F_EMPTY_PATH) < 0:
                    fail("move_mount")
    finally:
        for tree, _ in trees:
            os.close(tree)

for line in sys.stdin:
    fields = line.rstrip("\\n").split("\\t")
    try:
        if fields[1] == "check":
            os.close(idmapped(fields[2], tuple(int(v) for v in fields[3:7]), True))
        elif fields[1] == "mount":
            ids = tuple(int(v) for v in fields[4:8])
            rest = fields[8:]
            specs = [tuple(rest[i:i + 3]) for i in range(0, len(rest), 3)]
            mount_in(int(fields[2]), fields[3], ids, specs)
        else:
            raise ValueError("unknown request " + fields[1])
        print(fields[0] + "\\tok", flush=True)
    except Exception as e:
        print(fields[0] + "\\t" + str(e).replace("\\n", " "), flush=True)
`

/** Whose files are shown as whose: on disk the shared uid, in the sandbox its own. */
export interface IdmapIds {
  /** Owner of the files on disk (the shared sandbox uid). */
  diskUid: number
  diskGid: number
  /** The uid the sandbox runs as, which sees those files as its own. */
  uid: number
  gid: number
}

export interface IdmapMount {
  source: string
  /** Where it goes in the launcher's namespace: below `base`. */
  point: string
  readOnly: boolean
}

/** The long-lived helper, started on first use and again after it died. */
export class IdmapMounter {
  private readonly helper = new LineHelper(HELPER, 'idmapped mount')

  /** Makes an idmapped clone of `source` and drops it: whether this host can (nothing is mounted). */
  check(source: string, ids: IdmapIds): Promise<void> {
    return this.helper.request(['check', source, ids.diskUid, ids.diskGid, ids.uid, ids.gid])
  }

  /**
   * Mounts each of `mounts` at its point in the mount namespace of process `pid` (a launcher that
   * has unshared its own), over a fresh tmpfs at `base` there. They go with that namespace.
   */
  mountIn(pid: number, base: string, ids: IdmapIds, mounts: readonly IdmapMount[]): Promise<void> {
    return this.helper.request([
      'mount',
      pid,
      base,
      ids.diskUid,
      ids.diskGid,
      ids.uid,
      ids.gid,
      ...mounts.flatMap((m) => [m.source, m.point, m.readOnly ? 1 : 0]),
    ])
  }

  close(): void {
    this.helper.close()
  }
}
