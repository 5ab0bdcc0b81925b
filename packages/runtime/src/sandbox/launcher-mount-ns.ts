/**
 * Python shared by the root helpers that mount a bwrap sandbox's views (idmap-mounter.ts,
 * overlay-mounter.ts): every such mount is made in the mount namespace of the sandbox's launcher,
 * never in the host's.
 *
 * Why: a mount namespace starts as a copy of its parent's table, so each mount left in the host's
 * table made every later sandbox's start copy it, and each sandbox's bwrap take it down again. Two
 * idmapped mounts per warm sandbox made a cold start grow with the sandboxes held (27 ms idle,
 * 543 ms beside 1,640 warm ones: 3,281 mounts). The launcher unshares a mount namespace of its own
 * (private: nothing propagates to or from the host) before it says it is ready; the helper enters
 * it for one request, lays a small tmpfs over `base` (so the mount points never exist on the host's
 * disk), mounts there, and goes back. The sandbox's bwrap copies that table (the host's, plus the
 * sandbox's own few); the namespace, and every mount in it, goes with the sandbox's last process:
 * nothing to unmount, nothing left behind by a crash.
 *
 * `launcher_ns(pid, base)` refuses a process that still shares the helper's own namespace (a
 * launcher not yet unshared), so a mount can never land in the host's table. A helper that cannot
 * go back to its own namespace exits (the next request starts a fresh one).
 */
export const LAUNCHER_MOUNT_NS = `import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
CLONE_NEWNS, MS_NOSUID, MS_NODEV = 0x20000, 2, 4
HOST_NS = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)

def fail(what):
    e = ctypes.get_errno()
    raise OSError(e, "%s: %s" % (what, os.strerror(e)))

def mount(source, target, fstype, flags, data):
    if libc.mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode()) != 0:
        fail("mount " + fstype)

class launcher_ns:
    def __init__(self, pid, base):
        self.pid, self.base = pid, base

    def __enter__(self):
        fd = os.open("/proc/%d/ns/mnt" % self.pid, os.O_RDONLY | os.O_CLOEXEC)
        try:
            own, theirs = os.fstat(HOST_NS), os.fstat(fd)
            if (own.st_dev, own.st_ino) == (theirs.st_dev, theirs.st_ino):
                raise OSError(1, "process %d shares the host's mount namespace" % self.pid)
            if libc.setns(fd, CLONE_NEWNS) != 0:
                fail("setns")
        finally:
            os.close(fd)
        try:
            mount("cairn-ns", self.base, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0711,size=1m")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, kind, value, trace):
        if libc.setns(HOST_NS, CLONE_NEWNS) != 0:
            os._exit(70)
        return False
`
