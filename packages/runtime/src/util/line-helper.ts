import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process'
import { CairnProblem } from '@cairn/protocol'

/**
 * A long-lived python3 helper (which every sandbox host has) speaking one request per line,
 * `<id>\t<field>\t…`, and one answer per line, `<id>\tok` or `<id>\t<error>`. Started on first use
 * and again after it died; requests waiting when it dies fail. `what` names it in errors.
 */
export class LineHelper {
  private child: ChildProcessWithoutNullStreams | undefined
  private readonly pending = new Map<string, { resolve: () => void; reject: (error: Error) => void }>()
  private next = 0

  constructor(
    private readonly script: string,
    private readonly what: string,
  ) {}

  private ensure(): ChildProcessWithoutNullStreams {
    if (this.child && this.child.exitCode === null && !this.child.killed) return this.child
    const child = spawn('python3', ['-c', this.script], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
    })
    // A write to a helper that just died surfaces as its requests' failure (the 'exit' below).
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
        else waiter?.reject(new CairnProblem('sandbox_failed', `${this.what} failed: ${answer}`))
      }
    })
    child.stderr.resume()
    child.once('exit', () => {
      for (const waiter of this.pending.values()) {
        waiter.reject(new CairnProblem('sandbox_failed', `the ${this.what} helper exited`))
      }
      this.pending.clear()
    })
    this.child = child
    return child
  }

  /** Sends one request; a field holding a tab or a newline (it would break the line) is refused. */
  request(fields: (string | number)[]): Promise<void> {
    for (const field of fields) {
      if (/[\t\n]/.test(String(field)))
        return Promise.reject(new CairnProblem('bad_request', `unusable path ${field}`))
    }
    const id = String(this.next++)
    const child = this.ensure()
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject })
      child.stdin.write(`${[id, ...fields].join('\t')}\n`)
    })
  }

  close(): void {
    this.child?.stdin.end()
    this.child?.kill()
    this.child = undefined
  }
}
