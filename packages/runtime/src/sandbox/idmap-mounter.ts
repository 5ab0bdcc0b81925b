import { LineHelper } from '../util/line-helper.js'

/**
 * Idmapped mounts for the bwrap driver's per-sandbox host uids (see `SandboxUids`): files stay on
 * disk as the shared sandbox uid, and each sandbox sees its workspace and binds through a mount that
 * shows them as its own uid. One long-lived root helper (python3, which every sandbox host has).
 *
 * Why a helper user namespace: `mount_setattr(MOUNT_ATTR_IDMAP)` takes the idmap from a user
 * namespace, refuses the initial one (EPERM: it maps every id to itself, nothing to do) and needs a
 * namespace the caller is privileged over. The helper makes one per host uid (a child process
 * that `unshare(CLONE_NEWUSER)`s, whose maps the helper writes as root: disk uid → sandbox uid),
 * keeps its descriptor (the child exits; the namespace lives on), and reuses it whenever that uid
 * comes back. The mount itself is a detached clone (`open_tree(OPEN_TREE_CLONE)`): only a mount
 * no one sees yet may take an idmap. About 0.25 ms per mount here; the namespace, once per uid, 4–10 ms.
 *
 * Requests, one per line, tab-separated: `<id> mount <source> <point> <diskUid> <diskGid> <uid>
 * <gid> <ro 0|1>`, `<id> umount <point>`; answers `<id>\tok` or `<id>\t<error>`.
 */
const HELPER = `import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER = 0x10000000
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_EMPTY_PATH, AT_FDCWD = 1, 0x80000, 0x1000, -100
MOVE_MOUNT_F_EMPTY_PATH = 4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_IDMAP = 1, 2, 4, 0x00100000
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
namespaces = {}

def fail(what):
    e = ctypes.get_errno()
    raise OSError(e, "%s: %s" % (what, os.strerror(e)))

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

def mount(source, point, disk_uid, disk_gid, uid, gid, ro):
    ns = userns(disk_uid, disk_gid, uid, gid)
    tree = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, source.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)
    if tree < 0:
        fail("open_tree")
    try:
        flags = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_RDONLY if ro else 0)
        attr = (ctypes.c_uint64 * 4)(flags, 0, 0, ns)
        if libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, ctypes.byref(attr), 32) < 0:
            fail("mount_setattr")
        os.makedirs(point, 0o711, exist_ok=True)
        if libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, point.encode(), MOVE_MOUNT_F_EMPTY_PATH) < 0:
            fail("move_mount")
    finally:
        os.close(tree)

def umount(point):
    if libc.umount2(point.encode(), 2) != 0 and ctypes.get_errno() != 22:  # MNT_DETACH; EINVAL: not a mount
        fail("umount")
    os.rmdir(point)

for line in sys.stdin:
    fields = line.rstrip("\\n").split("\\t")
    try:
        if fields[1] == "mount":
            source, point = fields[2], fields[3]
            disk_uid, disk_gid, uid, gid, ro = (int(v) for v in fields[4:9])
            mount(source, point, disk_uid, disk_gid, uid, gid, ro == 1)
        elif fields[1] == "umount":
            umount(fields[2])
        print(fields[0] + "\\tok", flush=True)
    except Exception as e:
        print(fields[0] + "\\t" + str(e).replace("\\n", " "), flush=True)
`

export interface IdmapRequest {
  source: string
  point: string
  /** Owner of the files on disk (the shared sandbox uid). */
  diskUid: number
  diskGid: number
  /** The uid the sandbox runs as, which sees those files as its own. */
  uid: number
  gid: number
  readOnly: boolean
}

/** The long-lived helper, started on first use and again after it died. */
export class IdmapMounter {
  private readonly helper = new LineHelper(HELPER, 'idmapped mount')

  private request(fields: (string | number)[]): Promise<void> {
    return this.helper.request(fields)
  }

  /** Mounts `source` at `point` (made here) with its `diskUid` files shown as `uid`. */
  mount(r: IdmapRequest): Promise<void> {
    return this.request(['mount', r.source, r.point, r.diskUid, r.diskGid, r.uid, r.gid, r.readOnly ? 1 : 0])
  }

  /** Detaches the mount at `point` and removes the directory. */
  unmount(point: string): Promise<void> {
    return this.request(['umount', point])
  }

  close(): void {
    this.helper.close()
  }
}
