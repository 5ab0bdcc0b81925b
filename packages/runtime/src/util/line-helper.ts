import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process'
import { CairnProblem } from '@cairn/protocol'
import { OWN_PROCESS_GROUP } from './process-group.js'

/**
 * A long-lived python3 helper (which every sandbox host has) speaking one request per line,
 * `<id>\t<field>\t…`, and one answer per line, `<id>\tok` or `<id>\t<error>`. Started on first use
 * and again after it died; requests waiting when it dies fail. `what` names it in errors.
 */
interface Waiter {
  resolve: () => void
  reject: (error: Error) => void
}

export class LineHelper {
  /** The running helper and the requests it has not answered yet. */
  private child: { process: ChildProcessWithoutNullStreams; pending: Map<string, Waiter> } | undefined
  private next = 0

  constructor(
    private readonly script: string,
    private readonly what: string,
  ) {}

  private ensure(): { process: ChildProcessWithoutNullStreams; pending: Map<string, Waiter> } {
    // Forgotten when it exits, however it ended: one killed by a signal from elsewhere (a Ctrl-C to
    // the server's process group) has no exit code, and a request written to it would never settle.
    if (this.child) return this.child
    const child = spawn('python3', ['-c', this.script], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
      ...OWN_PROCESS_GROUP,
    })
    // A write to a helper that just died surfaces as its requests' failure (the 'exit' below).
    child.stdin.on('error', () => undefined)
    const pending = new Map<string, Waiter>()
    let buffered = ''
    child.stdout.setEncoding('utf8')
    child.stdout.on('data', (chunk: string) => {
      buffered += chunk
      for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
        const [id = '', answer = ''] = buffered.slice(0, nl).split('\t')
        buffered = buffered.slice(nl + 1)
        const waiter = pending.get(id)
        pending.delete(id)
        if (answer === 'ok') waiter?.resolve()
        else waiter?.reject(new CairnProblem('sandbox_failed', `${this.what} failed: ${answer}`))
      }
    })
    child.stderr.resume()
    child.once('exit', () => {
      if (this.child?.process === child) this.child = undefined
      for (const waiter of pending.values()) {
        waiter.reject(new CairnProblem('sandbox_failed', `the ${this.what} helper exited`))
      }
      pending.clear()
    })
    this.child = { process: child, pending }
    return this.child
  }

  /** Sends one request; a field holding a tab or a newline (it would break the line) is refused. */
  request(fields: (string | number)[]): Promise<void> {
    for (const field of fields) {
      if (/[\t\n]/.test(String(field)))
        return Promise.reject(new CairnProblem('bad_request', `unusable path ${field}`))
    }
    const id = String(this.next++)
    const { process: child, pending } = this.ensure()
    return new Promise((resolve, reject) => {
      pending.set(id, { resolve, reject })
      child.stdin.write(`${[id, ...fields].join('\t')}\n`)
    })
  }

  close(): void {
    this.child?.process.stdin.end()
    this.child?.process.kill()
    this.child = undefined
  }
}
