"""Cairn's btrfs helper: subvolume ioctls without a process spawn per operation.

One long-lived process per runtime reads JSON requests, one per line, on stdin and answers one
JSON line each on stdout: {"id", "ok": true} or {"id", "ok": false, "errno", "error"}.
Operations: snapshot {src, dst, readonly, mark, qgroup, max_referenced}, create {path, qgroup,
max_referenced}, delete {path}, delete_tree {path}, mark {path}, enable_quotas {path} (answers
{"mode": "squota" | "qgroup"}),
set_generation {path, value}, get_generations {paths} (answers {"values": [int or null]}) and
adopt_received {src, dst, qgroup}.
With a request as its only argument, it answers that one request and exits.

The generation marker is a `trusted.` extended attribute on the subvolume's root directory: it is
part of the subvolume (snapshots carry it, a replaced subvolume brings its own), and only a process
with CAP_SYS_ADMIN on the host can read or write it, so an agent inside a sandbox cannot forge it.

A mark is the subvolume's ctransid: the transaction of the last change to its inodes' metadata,
read without a commit (see `mark`). A snapshot asked for its source's mark also says, when it can,
the filesystem generation for which that mark holds (see `quiet_since`).
"""
import ctypes
import errno
import fcntl
import json
import os
import struct
import sys

BTRFS_IOC_SUBVOL_CREATE = 0x5000940E
BTRFS_IOC_SNAP_DESTROY = 0x5000940F
BTRFS_IOC_SNAP_CREATE_V2 = 0x50009417
BTRFS_IOC_SUBVOL_CREATE_V2 = 0x50009418
# _IOR(0x94, 60, struct btrfs_ioctl_get_subvol_info_args), 504 bytes; ctransid at offset 344.
BTRFS_IOC_GET_SUBVOL_INFO = 0x81F8943C
SUBVOL_INFO_SIZE = 504
SUBVOL_INFO_CTRANSID = 344
SUBVOL_INFO_OTRANSID = 352
SUBVOL_INFO_RECEIVED_UUID = 328
SUBVOL_INFO_STRANSID = 360
SUBVOL_INFO_STIME = 408
BTRFS_IOC_SET_RECEIVED_SUBVOL = 0xC0C89425
RECEIVED_SUBVOL_ARGS_SIZE = 200
BTRFS_IOC_SUBVOL_SETFLAGS = 0x4008941A
BTRFS_SUBVOL_RDONLY = 1 << 1
BTRFS_SUBVOL_QGROUP_INHERIT = 1 << 2
# _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args): qgroupid (0: the fd's subvolume), then limits.
BTRFS_IOC_QGROUP_LIMIT = 0x8030942B
# _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args {__u64 cmd; __u64 status;})
BTRFS_IOC_QUOTA_CTL = 0xC0109428
BTRFS_QUOTA_CTL_ENABLE = 1
BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA = 4
# _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args): 1024 bytes, the fsid at offset 16.
BTRFS_IOC_FS_INFO = 0x8400941F
BTRFS_QGROUP_LIMIT_MAX_RFER = 1 << 0
NAME_MAX_V1 = 4088
# Deleting a tree of subvolumes by ID (delete_tree): _IOWR(0x94, 17 | 18, 4096), _IOW(0x94, 63, 4096).
BTRFS_IOC_TREE_SEARCH = 0xD0009411
BTRFS_IOC_INO_LOOKUP = 0xD0009412
BTRFS_IOC_SNAP_DESTROY_V2 = 0x5000943F
BTRFS_SUBVOL_SPEC_BY_ID = 1 << 4
BTRFS_ROOT_TREE_OBJECTID = 1
BTRFS_ROOT_REF_KEY = 156
BTRFS_FIRST_FREE_OBJECTID = 256
U64_MAX = 2**64 - 1
SEARCH_KEY = struct.Struct("7Q4I4Q")
SEARCH_HEADER = struct.Struct("3Q2I")
NAME_MAX_V2 = 4040


def split(path):
    parent, name = os.path.split(os.path.normpath(path))
    if not name or "/" in name or len(name.encode()) > 255:
        raise OSError(errno.EINVAL, "invalid subvolume name")
    return parent, name


def vol_args(fd, name):
    return bytearray(struct.pack("q", fd) + name.encode().ljust(NAME_MAX_V1, b"\0"))


def qgroup_inherit(qgroup):
    """A struct btrfs_qgroup_inherit: the new subvolume's qgroup joins `qgroup` (a level-1 group,
    as a 64-bit qgroupid) in the same transaction as the subvolume itself, so the group's figures
    stay exact without a rescan. None: no inheritance."""
    if not qgroup:
        return None
    body = struct.pack("4Q", 0, 1, 0, 0) + struct.pack("5Q", 0, 0, 0, 0, 0) + struct.pack("Q", int(qgroup))
    return ctypes.create_string_buffer(body, len(body))


def limit_referenced(path, max_referenced):
    """Caps the subvolume's own qgroup: writes past `max_referenced` bytes fail with EDQUOT.
    A subvolume that cannot be capped is removed again: none is ever left without its limit."""
    if not max_referenced:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            args = struct.pack("6Q", 0, BTRFS_QGROUP_LIMIT_MAX_RFER, int(max_referenced), 0, 0, 0)
            fcntl.ioctl(fd, BTRFS_IOC_QGROUP_LIMIT, bytearray(args))
        finally:
            os.close(fd)
    except OSError:
        try:
            delete(path)
        except OSError:
            pass
        raise


def vol_args_v2(fd, name, flags, inherit):
    if inherit is not None:
        flags |= BTRFS_SUBVOL_QGROUP_INHERIT
        extra = struct.pack("QQ2Q", ctypes.sizeof(inherit), ctypes.addressof(inherit), 0, 0)
    else:
        extra = struct.pack("4Q", 0, 0, 0, 0)
    return bytearray(struct.pack("qQQ", fd, 0, flags) + extra + name.encode().ljust(NAME_MAX_V2, b"\0"))


def snapshot(src, dst, readonly, qgroup=None, max_referenced=None):
    parent, name = split(dst)
    inherit = qgroup_inherit(qgroup)
    src_fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    try:
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            flags = BTRFS_SUBVOL_RDONLY if readonly else 0
            fcntl.ioctl(dir_fd, BTRFS_IOC_SNAP_CREATE_V2, vol_args_v2(src_fd, name, flags, inherit))
        finally:
            os.close(dir_fd)
    finally:
        os.close(src_fd)
    limit_referenced(dst, max_referenced)


def dir_ioctl(path, request):
    """An ioctl on the parent directory that names the subvolume (create, destroy)."""
    parent, name = split(path)
    dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(dir_fd, request, vol_args(0, name))
    finally:
        os.close(dir_fd)


def mark(path):
    """The subvolume's ctransid, from the in-memory root item (no commit, microseconds).

    btrfs sets it to the running transaction whenever an inode of the subvolume is updated
    (create, unlink, rename, chmod, truncate, xattrs, and the extents a flush of written data
    inserts), so it moves past the value read just after a snapshot as soon as anything but a
    buffered data write changes the subvolume. Buffered writes reach the tree only when they are
    flushed: callers detect those separately (the writers' dirtied-page counters).
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        args = bytearray(SUBVOL_INFO_SIZE)
        fcntl.ioctl(fd, BTRFS_IOC_GET_SUBVOL_INFO, args)
    finally:
        os.close(fd)
    return struct.unpack_from("Q", args, SUBVOL_INFO_CTRANSID)[0]


def quiet_since(dst):
    """The transaction that made the snapshot `dst` (just taken), when none has begun since.

    The filesystem's generation (sysfs) is the newest transaction begun, running or committed; a
    snapshot returns once its transaction is committed, and every later change of any subvolume
    joins a newer one. So while the generation stays at the snapshot's, no inode anywhere has been
    updated since, and a mark read now is still the subvolume's. A generation already past it (a
    transaction begun meanwhile, which later changes could still join) gives nothing: the mark
    must be asked. Answers {"generation", "file"} (the sysfs file to read it in) or None.
    """
    fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    try:
        file = sysfs_dir(fd) + "/generation"
        args = bytearray(SUBVOL_INFO_SIZE)
        fcntl.ioctl(fd, BTRFS_IOC_GET_SUBVOL_INFO, args)
    finally:
        os.close(fd)
    made = struct.unpack_from("Q", args, SUBVOL_INFO_OTRANSID)[0]
    try:
        with open(file) as f:
            generation = int(f.read())
    except (OSError, ValueError):
        return None
    return {"generation": made, "file": file} if generation == made else None


def adopt_received(src, dst, qgroup=None):
    """Gives a subvolume `btrfs receive` made a second name elsewhere, as received.

    A read-only subvolume cannot be moved to another directory (its root's `..` would change), and
    a plain snapshot of it would lose its received UUID, by which a later incremental stream finds
    its parent. So `dst` is made a writable snapshot of `src`, given `src`'s received UUID, send
    transid and time (as `btrfs receive` does to the subvolumes it makes), then made read-only.
    `qgroup`: the level-1 group `dst` joins as it is made (its tenant's).
    """
    info = bytearray(SUBVOL_INFO_SIZE)
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, BTRFS_IOC_GET_SUBVOL_INFO, info)
    finally:
        os.close(fd)
    received_uuid = bytes(info[SUBVOL_INFO_RECEIVED_UUID:SUBVOL_INFO_RECEIVED_UUID + 16])
    if received_uuid == bytes(16):
        raise OSError(errno.EINVAL, "%s is not a received subvolume" % src)
    snapshot(src, dst, False, qgroup)
    try:
        args = bytearray(RECEIVED_SUBVOL_ARGS_SIZE)
        args[0:16] = received_uuid
        args[16:24] = info[SUBVOL_INFO_STRANSID:SUBVOL_INFO_STRANSID + 8]
        args[32:48] = info[SUBVOL_INFO_STIME:SUBVOL_INFO_STIME + 16]
        fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, BTRFS_IOC_SET_RECEIVED_SUBVOL, args)
            fcntl.ioctl(fd, BTRFS_IOC_SUBVOL_SETFLAGS, struct.pack("Q", BTRFS_SUBVOL_RDONLY))
        finally:
            os.close(fd)
    except OSError:
        delete(dst)
        raise


def create(path, qgroup=None, max_referenced=None):
    if not qgroup:
        dir_ioctl(path, BTRFS_IOC_SUBVOL_CREATE)
    else:
        parent, name = split(path)
        inherit = qgroup_inherit(qgroup)
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(dir_fd, BTRFS_IOC_SUBVOL_CREATE_V2, vol_args_v2(0, name, 0, inherit))
        finally:
            os.close(dir_fd)
    limit_referenced(path, max_referenced)


def delete(path):
    dir_ioctl(path, BTRFS_IOC_SNAP_DESTROY)


def subvolume_id(fd):
    """The ID of the subvolume whose root directory `fd` is (EINVAL for any other directory)."""
    if os.fstat(fd).st_ino != BTRFS_FIRST_FREE_OBJECTID:
        raise OSError(errno.EINVAL, "not a subvolume")
    args = bytearray(struct.pack("QQ", 0, BTRFS_FIRST_FREE_OBJECTID) + bytes(4080))
    fcntl.ioctl(fd, BTRFS_IOC_INO_LOOKUP, args)
    return struct.unpack_from("Q", args, 0)[0]


def child_subvolumes(fd, parent_id):
    """IDs of the subvolumes directly inside subvolume `parent_id`, from its ROOT_REF items in the
    root tree (`fd`: any file of the filesystem). No path is walked, so nothing an agent renames or
    links while this runs changes the answer."""
    children = []
    min_offset = 0
    while True:
        key = SEARCH_KEY.pack(
            BTRFS_ROOT_TREE_OBJECTID, parent_id, parent_id, min_offset, U64_MAX, 0, U64_MAX,
            BTRFS_ROOT_REF_KEY, BTRFS_ROOT_REF_KEY, 4096, 0, 0, 0, 0, 0,
        )
        args = bytearray(key + bytes(4096 - len(key)))
        fcntl.ioctl(fd, BTRFS_IOC_TREE_SEARCH, args)
        count = SEARCH_KEY.unpack_from(args, 0)[9]
        position = SEARCH_KEY.size
        last = None
        for _ in range(count):
            _transid, objectid, offset, kind, length = SEARCH_HEADER.unpack_from(args, position)
            position += SEARCH_HEADER.size + length
            if kind == BTRFS_ROOT_REF_KEY and objectid == parent_id:
                children.append(offset)
            last = offset
        if not count or last is None or last >= U64_MAX:
            return children
        min_offset = last + 1


def destroy_by_id(fd, subvolume):
    args = struct.pack("qQQ", 0, 0, BTRFS_SUBVOL_SPEC_BY_ID) + bytes(32) + struct.pack("Q", subvolume)
    fcntl.ioctl(fd, BTRFS_IOC_SNAP_DESTROY_V2, bytearray(args.ljust(4096, b"\0")))


def delete_tree(path):
    """Deletes the subvolume at `path` and every subvolume nested in it (an agent may create its
    own), innermost first. The nested ones are found and deleted by ID, never by path names, so a
    directory swapped for a link to another tenant's tree cannot send the deletion there; `path`
    itself is opened without following a link. Subvolumes made while this runs are found on the
    next round."""
    parent, name = split(path)
    dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
        try:
            top = subvolume_id(fd)
            for attempt in range(5):
                # Depth-first, without recursion (an agent may nest thousands deep).
                order, pending = [], [top]
                while pending:
                    current = pending.pop()
                    if current != top:
                        order.append(current)
                    pending.extend(child_subvolumes(fd, current))
                for subvolume in reversed(order):
                    try:
                        destroy_by_id(fd, subvolume)
                    except OSError as error:
                        if error.errno != errno.ENOENT:
                            raise
                try:
                    destroy_by_id(dir_fd, top)
                    return
                except OSError as error:
                    if error.errno != errno.ENOTEMPTY or attempt == 4:
                        raise
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


GENERATION_XATTR = "trusted.cairn.generation"


def set_generation(path, value):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.setxattr(fd, GENERATION_XATTR, str(int(value)).encode())
    finally:
        os.close(fd)


def get_generation(path):
    try:
        return int(os.getxattr(path, GENERATION_XATTR).decode())
    except OSError as error:
        if error.errno in (errno.ENODATA, errno.ENOENT):
            return None
        raise
    except ValueError:
        return None


def sysfs_dir(fd):
    """The filesystem's directory in sysfs, /sys/fs/btrfs/<fsid>."""
    info = bytearray(1024)
    fcntl.ioctl(fd, BTRFS_IOC_FS_INFO, info)
    fsid = bytes(info[16:32]).hex()
    return "/sys/fs/btrfs/" + "-".join((fsid[:8], fsid[8:12], fsid[12:16], fsid[16:20], fsid[20:]))


def quota_mode(fd):
    """The filesystem's quota mode as its sysfs says: squota, qgroup or disabled."""
    try:
        with open(sysfs_dir(fd) + "/qgroups/mode") as f:
            return f.read().strip()
    except FileNotFoundError:
        return "disabled"


def enable_quotas(path):
    """Turns quotas on, as simple quotas where the kernel has them (6.7+): an extent counts for
    the subvolume that wrote it, so no snapshot or write needs the walk of every tree sharing its
    data that full qgroups do (measured: a snapshot of a revision and the first write in it grew by
    ~1.7 ms per snapshot of it already made; with simple quotas they stay flat). A pool that has
    full qgroups already keeps them (a mode is changed only by turning quotas off, which drops
    every limit)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        mode = quota_mode(fd)
        if mode in ("squota", "qgroup"):
            return mode
        try:
            fcntl.ioctl(fd, BTRFS_IOC_QUOTA_CTL, bytearray(struct.pack("QQ", BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA, 0)))
        except OSError as error:
            if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTTY):
                raise
            fcntl.ioctl(fd, BTRFS_IOC_QUOTA_CTL, bytearray(struct.pack("QQ", BTRFS_QUOTA_CTL_ENABLE, 0)))
        return quota_mode(fd)
    finally:
        os.close(fd)


def handle(request):
    op = request.get("op")
    if op == "set_generation":
        set_generation(request["path"], request["value"])
        return None
    if op == "get_generations":
        return {"values": [get_generation(p) for p in request["paths"]]}
    if op == "snapshot":
        snapshot(
            request["src"],
            request["dst"],
            bool(request.get("readonly")),
            request.get("qgroup"),
            request.get("max_referenced"),
        )
        # Read after the snapshot's commit, which flushed the source's written data first; the
        # generation first (a change between the two reads leaves it behind: nothing is held).
        if request.get("mark"):
            quiet = quiet_since(request["dst"])
            return {"mark": mark(request["src"]), **({"quiet": quiet} if quiet else {})}
    elif op == "mark":
        return {"mark": mark(request["path"])}
    elif op == "create":
        create(request["path"], request.get("qgroup"), request.get("max_referenced"))
    elif op == "delete":
        delete(request["path"])
    elif op == "delete_tree":
        delete_tree(request["path"])
    elif op == "adopt_received":
        adopt_received(request["src"], request["dst"], request.get("qgroup"))
    elif op == "enable_quotas":
        return {"mode": enable_quotas(request["path"])}
    elif op == "sysfs_dir":
        fd = os.open(request["path"], os.O_RDONLY | os.O_DIRECTORY)
        try:
            return {"dir": sysfs_dir(fd)}
        finally:
            os.close(fd)
    elif op == "ping":
        pass
    else:
        raise OSError(errno.EINVAL, "unknown op %r" % op)
    return None


def answer(line):
    request = {}
    try:
        request = json.loads(line)
        data = handle(request)
        reply = {"id": request.get("id"), "ok": True}
        if data:
            reply.update(data)
    except OSError as error:
        reply = {"id": request.get("id"), "ok": False, "errno": error.errno, "error": os.strerror(error.errno or 0) if error.errno else str(error)}
    except Exception as error:  # noqa: BLE001 - every failure must reach the caller as a reply
        reply = {"id": request.get("id"), "ok": False, "errno": 0, "error": str(error)}
    return json.dumps(reply)


def main():
    if len(sys.argv) > 1:
        print(answer(sys.argv[1]))
        return
    out = sys.stdout
    for line in sys.stdin:
        out.write(answer(line) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
