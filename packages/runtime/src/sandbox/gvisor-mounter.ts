import { LineHelper } from '../util/line-helper.js'

/**
 * The pool's mount helper (python3, which every sandbox host has): it makes a claim's binds with
 * mount(2) directly, where `mount` and `sh` processes cost a claim 10 to 25 ms on a busy host.
 * One request per line: `<id>\t<source>\t<point>\t<ro 0|1>\t<staging dir>`; one answer per line:
 * `<id>\tok` or `<id>\t<error>`. A read-only bind is made read-only in the private staging
 * directory first and then moved into place: a remount after the bind would not reach the copy in
 * the gofer's mount namespace, through which the agent could still write.
 */
const MOUNTER = `import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_MOVE = 1, 2, 4, 32, 4096, 8192
def mount(source, target, flags):
    if libc.mount(source, target, None, flags, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
for line in sys.stdin:
    rid, source, point, ro, staged = line.rstrip("\\n").split("\\t")
    try:
        source, point, staged = source.encode(), point.encode(), staged.encode()
        if ro == "1":
            os.mkdir(staged, 0o700)
            try:
                mount(source, staged, MS_BIND)
                mount(None, staged, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
                mount(staged, point, MS_MOVE)
            finally:
                try:
                    libc.umount2(staged, 2)
                except Exception:
                    pass
                os.rmdir(staged)
        else:
            mount(source, point, MS_BIND)
        print(rid + "\\tok", flush=True)
    except Exception as e:
        print(rid + "\\t" + str(e).replace("\\n", " "), flush=True)
`

/** One long-lived mount helper, started on first use and again after it died. */
export class Mounter {
  private readonly helper = new LineHelper(MOUNTER, 'bind into a gVisor pool slot')

  /** Binds `source` onto `point`; read-only binds pass through `staged` (in a private mount). */
  bind(source: string, point: string, readOnly: boolean, staged: string): Promise<void> {
    return this.helper.request([source, point, readOnly ? 1 : 0, staged])
  }

  close(): void {
    this.helper.close()
  }
}
