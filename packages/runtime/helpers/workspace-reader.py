"""The only host-side reader of workspace trees (live workspaces, snapshots, revisions).

Run by the server as `python3 workspace-reader.py ROOT COMMAND [ARG]`, one process per request,
killed when the request ends. Every path is walked by file descriptors from one opened on ROOT:
each component is opened with O_NOFOLLOW (a symlink at any component, swapped in at any moment,
fails the open instead of being followed), entries are stat'ed and read relative to their
directory's descriptor without following links, and nothing but a regular file is ever opened for
reading (FIFOs, sockets and devices are recorded, never opened). Names are bytes throughout.

Commands (ARG is a workspace-relative path, base64 of its bytes):
  list ARG     one directory: a line per entry, NAME TYPE SIZE MODE MTIME_NS TARGET (tab-separated,
               names and link targets base64); refused (payload_too_large) past LIST_MAX_ENTRIES
               entries or LIST_MAX_PATH_BYTES of the paths the answer carries
  read ARG     a regular file: a line `size N`, then its N bytes
  stamps N     the whole tree (at most N entries): a line per entry as for `list`, with the path
               relative to the root for NAME, in walk order; for diffs. The walk stops early once
               the paths printed pass STAMPS_MAX_PATH_BYTES, and then a last line `truncated`
  digest       the tree's content digest (see `cmd_digest` below)
  exists ARG   `yes` if an entry of any type (a link included, never followed) is at ARG, else `no`;
               a link or non-directory among ARG's parents is `no` as well, whatever it points to
Failures: a line `error CODE MESSAGE` (tab-separated) on stdout and exit status 3.
Only built-in modules are imported up front (no json, no re): a listing costs one process start.
"""
import binascii, os, stat, sys

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOATIME", 0)
BLOCK = 1 << 20
ZERO_BLOCK = bytes(BLOCK)
# A listing is answered whole (every entry with its full path): the agent chooses its size, so it
# is capped before the server parses it.
LIST_MAX_ENTRIES = 50000
LIST_MAX_PATH_BYTES = 16 << 20
# A diff's walk prints every path below the root: as many bytes of them as the answer may carry.
STAMPS_MAX_PATH_BYTES = 16 << 20


class Refused(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def b64(raw):
    return binascii.b2a_base64(raw, newline=False).decode("ascii")


def unb64(text):
    return binascii.a2b_base64(text.encode("ascii"))


def entry_line(name, info, target):
    return "%s\t%s\t%d\t%d\t%d\t%s\n" % (
        b64(name), type_of(info.st_mode), info.st_size, stat.S_IMODE(info.st_mode), info.st_mtime_ns, target)


def open_flags(name, flags, dir_fd):
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except PermissionError:
        # O_NOATIME is refused on files the caller does not own unless it has CAP_FOWNER.
        return os.open(name, flags & ~getattr(os, "O_NOATIME", 0), dir_fd=dir_fd)


def components(rel):
    parts = [p for p in rel.split(b"/") if p not in (b"", b".")]
    if b".." in parts:
        raise Refused("validation_failed", "path escapes the workspace")
    if any(len(p) > 255 for p in parts):  # NAME_MAX: the file system would answer ENAMETOOLONG
        raise Refused("validation_failed", "a name in the path is longer than 255 bytes")
    return parts


def open_dir_at(root_fd, parts):
    """The directory `parts` beneath root_fd, every component opened without following links."""
    fd = os.dup(root_fd)
    for part in parts:
        try:
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            raise Refused("not_found", "no such directory")
        except OSError as e:
            if e.errno in (20, 40):  # ENOTDIR, ELOOP: a file, or a link (never followed)
                try:
                    is_link = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                except OSError:
                    is_link = False
                if is_link:
                    raise Refused("forbidden", "a symbolic link is in the path")
                raise Refused("validation_failed", "not a directory")
            raise
        finally:
            os.close(fd)
        fd = child
    return fd


def type_of(mode):
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def names_of(dir_fd, prefix_bytes=None):
    """The names in an open directory, as bytes; refused past the listing's caps when
    `prefix_bytes` (the length of the path each entry's answer carries before its name) is given."""
    names, path_bytes = [], 0
    with os.scandir(dir_fd) as it:
        for entry in it:
            raw = os.fsencode(entry.name)
            if prefix_bytes is not None:
                path_bytes += prefix_bytes + len(raw)
                if len(names) >= LIST_MAX_ENTRIES or path_bytes > LIST_MAX_PATH_BYTES:
                    raise Refused(
                        "payload_too_large",
                        "the directory holds more than %d entries or %d MiB of paths: list a subdirectory, or export the workspace"
                        % (LIST_MAX_ENTRIES, LIST_MAX_PATH_BYTES >> 20),
                    )
            names.append(raw)
    return names


def entries_of(dir_fd, prefix_bytes=None):
    """(name, lstat) of each entry of an open directory; entries that vanish meanwhile are skipped."""
    out = []
    for raw in names_of(dir_fd, prefix_bytes):
        try:
            out.append((raw, os.stat(raw, dir_fd=dir_fd, follow_symlinks=False)))
        except FileNotFoundError:
            pass
    return out


def link_target(name, dir_fd):
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return b""


def cmd_list(root_fd, rel):
    fd = open_dir_at(root_fd, components(rel))
    try:
        out = []
        # Each entry's answer carries `/workspace/REL/NAME`.
        for name, info in entries_of(fd, len(b"/workspace/") + len(rel) + 1):
            target = b64(link_target(name, fd)) if stat.S_ISLNK(info.st_mode) else ""
            out.append(entry_line(name, info, target))
        sys.stdout.write("".join(out))
    finally:
        os.close(fd)


def cmd_read(root_fd, rel):
    parts = components(rel)
    if not parts:
        raise Refused("validation_failed", "not a regular file")
    dir_fd = open_dir_at(root_fd, parts[:-1])
    try:
        try:
            fd = open_flags(parts[-1], FILE_FLAGS, dir_fd)
        except FileNotFoundError:
            raise Refused("not_found", "no such file")
        except OSError as e:
            if e.errno == 40:
                raise Refused("forbidden", "a symbolic link is in the path")
            if e.errno in (6, 19):  # ENXIO, ENODEV: a socket or a device
                raise Refused("validation_failed", "not a regular file")
            raise
    finally:
        os.close(dir_fd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Refused("validation_failed", "not a regular file")
    os.set_blocking(fd, True)
    out = sys.stdout.buffer
    out.write(b"size\t%d\n" % info.st_size)
    out.flush()
    left, offset = info.st_size, 0
    while left > 0:
        chunk = os.pread(fd, min(BLOCK, left), offset)
        if not chunk:
            break  # truncated meanwhile: the answer is short, the client sees it
        out.write(chunk)
        left -= len(chunk)
        offset += len(chunk)
    out.flush()
    os.close(fd)


def cmd_exists(root_fd, rel):
    """Answers from the tree alone: a link anywhere on the path is never followed, so where it
    points on the host (a file there or not) changes nothing in the answer."""
    parts = components(rel)
    if not parts:
        sys.stdout.write("yes\n")
        return
    try:
        dir_fd = open_dir_at(root_fd, parts[:-1])
    except Refused as e:
        if e.code in ("not_found", "forbidden", "validation_failed"):
            sys.stdout.write("no\n")
            return
        raise
    try:
        os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
        found = True
    except (FileNotFoundError, NotADirectoryError):
        found = False
    finally:
        os.close(dir_fd)
    sys.stdout.write("yes\n" if found else "no\n")


def walk(root_fd, visit, limit=None):
    """Depth first, names in byte order; `visit(rel, name, info, dir_fd)` for every entry below root.
    Directories are entered by descriptor with O_NOFOLLOW: one swapped for a link is not entered."""
    count = 0
    stack = [(b"", os.dup(root_fd), None)]
    while stack:
        rel, fd, pending = stack[-1]
        if pending is None:
            pending = sorted(entries_of(fd), key=lambda e: e[0], reverse=True)
            stack[-1] = (rel, fd, pending)
        if not pending or (limit is not None and count >= limit):
            os.close(fd)
            stack.pop()
            continue
        name, info = pending.pop()
        child_rel = rel + b"/" + name if rel else name
        count += 1
        visit(child_rel, name, info, fd)
        if stat.S_ISDIR(info.st_mode):
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # replaced or removed meanwhile
            stack.append((child_rel, child, None))
    return count


class Enough(Exception):
    pass


def cmd_stamps(root_fd, limit):
    out = []
    path_bytes = [0]

    def visit(rel, name, info, dir_fd):
        path_bytes[0] += len(rel)
        if path_bytes[0] > STAMPS_MAX_PATH_BYTES:
            raise Enough()
        target = b64(link_target(name, dir_fd)) if stat.S_ISLNK(info.st_mode) else ""
        out.append(entry_line(rel, info, target))

    try:
        walk(root_fd, visit, limit)
        sys.stdout.write("".join(out))
    except Enough:
        sys.stdout.write("".join(out) + "truncated\n")


def file_digest(fd, size):
    """A regular file's content hash, cheap over holes: the content is cut in 1 MiB blocks; a run
    of all-zero blocks (holes or written zeros alike) is one record `z COUNT`, any other block a
    record `d ` + its SHA-256. Holes are found with SEEK_DATA and never read, so the cost is the
    file's data, not its size; the result depends only on the bytes, not on where the holes are."""
    import hashlib

    h = hashlib.sha256(b"cairn-file-v2 %d\n" % size)
    zeros = 0
    block = 0
    blocks = (size + BLOCK - 1) // BLOCK
    while block < blocks:
        try:
            data_at = os.lseek(fd, block * BLOCK, os.SEEK_DATA)
        except OSError:
            data_at = size  # ENXIO: only a hole is left
        first_data_block = min(blocks, data_at // BLOCK)
        if first_data_block > block:
            zeros += first_data_block - block
            block = first_data_block
            continue
        length = min(BLOCK, size - block * BLOCK)
        chunk = os.pread(fd, length, block * BLOCK)
        if len(chunk) < length:
            chunk += bytes(length - len(chunk))  # truncated meanwhile (a snapshot never is)
        if chunk == ZERO_BLOCK[:length]:
            zeros += 1
        else:
            if zeros:
                h.update(b"z %d\n" % zeros)
                zeros = 0
            h.update(b"d " + hashlib.sha256(chunk).digest())
        block += 1
    if zeros:
        h.update(b"z %d\n" % zeros)
    return h.hexdigest()


def cmd_digest(root_fd):
    """Every entry below the root as `TYPE MODE PATHHEX PAYLOAD`, in depth-first byte order of the
    names; PAYLOAD is a file's `file_digest` or a link's target in hex. Owners and times are left
    out; FIFOs, sockets and devices count by type and mode only and are never opened."""
    import hashlib

    h = hashlib.sha256(b"cairn-tree-v2\n")
    codes = {"symlink": "l", "directory": "d", "file": "f", "other": "o"}

    def visit(rel, name, info, dir_fd):
        kind = type_of(info.st_mode)
        payload = ""
        if kind == "symlink":
            payload = link_target(name, dir_fd).hex()
        elif kind == "file":
            fd = open_flags(name, FILE_FLAGS, dir_fd)
            try:
                opened = os.fstat(fd)
                if not stat.S_ISREG(opened.st_mode):
                    raise Refused("conflict", "the tree changed while it was read")
                payload = file_digest(fd, opened.st_size)
            finally:
                os.close(fd)
        h.update(("%s %o %s %s\n" % (codes[kind], stat.S_IMODE(info.st_mode), rel.hex(), payload)).encode())

    walk(root_fd, visit)
    sys.stdout.write("sha256:" + h.hexdigest())


def main():
    root, command = os.fsencode(sys.argv[1]), sys.argv[2]
    arg = sys.argv[3] if len(sys.argv) > 3 else ""
    try:
        try:
            root_fd = os.open(root, DIR_FLAGS)
        except FileNotFoundError:
            raise Refused("not_found", "the tree is gone")
        if command == "list":
            cmd_list(root_fd, unb64(arg))
        elif command == "read":
            cmd_read(root_fd, unb64(arg))
        elif command == "stamps":
            cmd_stamps(root_fd, int(arg))
        elif command == "digest":
            cmd_digest(root_fd)
        elif command == "exists":
            cmd_exists(root_fd, unb64(arg))
        else:
            raise Refused("internal", "unknown command " + command)
        sys.stdout.flush()
    except Refused as e:
        sys.stdout.write("error\t%s\t%s\n" % (e.code, str(e).replace("\n", " ")))
        sys.stdout.flush()
        sys.exit(3)
    except BrokenPipeError:
        sys.exit(4)


if __name__ == "__main__":
    main()
