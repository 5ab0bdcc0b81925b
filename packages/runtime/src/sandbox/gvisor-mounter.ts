import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process'
import { CairnProblem } from '@cairn/protocol'

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
  private child: ChildProcessWithoutNullStreams | undefined
  private readonly pending = new Map<string, { resolve: () => void; reject: (error: Error) => void }>()
  private next = 0

  private ensure(): ChildProcessWithoutNullStreams {
    if (this.child && this.child.exitCode === null && !this.child.killed) return this.child
    const child = spawn('python3', ['-c', MOUNTER], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
    })
    child.stdin.on('error', () => undefined)
    let buffered = ''
    child.stdout.setEncoding('utf8')
    child.stdout.on('data', (chunk: string) => {
      buffered += chunk
      for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
        const [id = '', answer = ''] = buffered.slice(0, nl).split('\t')
        buffered = buffered.slice(nl + 1)
        const waiter = this.pending.get(id)
        this.pending.delete(id)
        if (answer === 'ok') waiter?.resolve()
        else
          waiter?.reject(new CairnProblem('sandbox_failed', `bind into a gVisor pool slot failed: ${answer}`))
      }
    })
    child.stderr.resume()
    child.once('exit', () => {
      for (const waiter of this.pending.values()) {
        waiter.reject(new CairnProblem('sandbox_failed', 'the gVisor pool mount helper exited'))
      }
      this.pending.clear()
    })
    this.child = child
    return child
  }

  /** Binds `source` onto `point`; read-only binds pass through `staged` (in a private mount). */
  bind(source: string, point: string, readOnly: boolean, staged: string): Promise<void> {
    for (const field of [source, point, staged]) {
      if (/[\t\n]/.test(field))
        return Promise.reject(new CairnProblem('bad_request', `unusable path ${field}`))
    }
    const id = String(this.next++)
    const child = this.ensure()
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject })
      child.stdin.write(`${id}\t${source}\t${point}\t${readOnly ? 1 : 0}\t${staged}\n`)
    })
  }

  close(): void {
    this.child?.stdin.end()
    this.child?.kill()
    this.child = undefined
  }
}
