import { spawn } from 'node:child_process'
import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { StringDecoder } from 'node:string_decoder'
import { CairnProblem } from '@cairn/protocol'
import { EgressProxy, type EgressSite, type NetworkEvent } from '../egress/proxy.js'
import { OWN_PROCESS_GROUP } from '../util/process-group.js'

/**
 * Relays 127.0.0.1:3128 to the egress proxy's unix socket (argv[1]) inside a fresh network
 * namespace, brings its loopback up, runs the command (argv after `--`) and exits with its status.
 */
const RELAY = `import os, socket, subprocess, sys, threading
sock = sys.argv[1]
cmd = sys.argv[sys.argv.index("--") + 1:]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", 3128))
server.listen(64)
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
def serve():
    while True:
        client, _ = server.accept()
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(sock)
        except OSError:
            client.close()
            continue
        threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
sys.exit(subprocess.run(cmd).returncode)
`

export const IMAGE_PROXY_URL = 'http://127.0.0.1:3128'

export interface ProxiedCommand {
  command: readonly string[]
  /** Hosts (`host`, `host:port`, `*.domain`) the command may reach, through the egress proxy only. */
  allow: readonly string[]
  site: EgressSite | undefined
  env?: Readonly<Record<string, string>> | undefined
  timeoutMs: number
  /** Stops the command (SIGKILL); the call then rejects with the signal's reason. */
  signal?: AbortSignal | undefined
  /** Every output line, and each refused connection. */
  log: (line: string) => void
}

/**
 * Runs a host tool as root (mmdebstrap, skopeo) in a network namespace of its own whose only way
 * out is the egress proxy, with the allowlist given: the address guard, the operator's private
 * exceptions and hosts map apply to image builds and pulls as to sandboxes, so an `image:` cannot
 * reach the host's loopback or a private address the operator did not open.
 */
export async function runProxied(spec: ProxiedCommand): Promise<void> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'cairn-image-'))
  // The last lines, for the error: what the tool said before it failed.
  const tail: string[] = []
  const log = (line: string) => {
    tail.push(line)
    if (tail.length > 3) tail.shift()
    spec.log(line)
  }
  const onEvent = (event: NetworkEvent) => {
    if (!event.allowed) log(`egress: refused ${event.host}:${event.port} (${event.reason})`)
  }
  const proxy = new EgressProxy({
    ...spec.site,
    policy: { allow: [...spec.allow] },
    onEvent,
    socketPath: path.join(dir, 'egress.sock'),
  })
  try {
    await proxy.listen()
    const child = spawn(
      'unshare',
      [
        '--net',
        '--mount',
        '--fork',
        '--kill-child',
        '--',
        'python3',
        '-c',
        RELAY,
        path.join(dir, 'egress.sock'),
        '--',
        ...spec.command,
      ],
      {
        stdio: ['ignore', 'pipe', 'pipe'],
        ...OWN_PROCESS_GROUP,
        env: {
          PATH: '/usr/sbin:/usr/bin:/sbin:/bin',
          HOME: '/root',
          LANG: 'C.UTF-8',
          http_proxy: IMAGE_PROXY_URL,
          https_proxy: IMAGE_PROXY_URL,
          HTTP_PROXY: IMAGE_PROXY_URL,
          HTTPS_PROXY: IMAGE_PROXY_URL,
          ...spec.env,
        },
      },
    )
    for (const stream of [child.stdout, child.stderr]) {
      const decoder = new StringDecoder('utf8')
      let pending = ''
      stream.on('data', (chunk: Buffer) => {
        pending += decoder.write(chunk).replace(/\r(?!\n)/g, '\n')
        const lines = pending.split('\n')
        pending = lines.pop() ?? ''
        for (const line of lines) log(line)
      })
      stream.on('end', () => pending && log(pending))
    }
    // The whole group: the relay and the tool it runs (skopeo, mmdebstrap) stop with unshare.
    const killGroup = () => {
      try {
        if (child.pid) process.kill(-child.pid, 'SIGKILL')
      } catch {
        child.kill('SIGKILL')
      }
    }
    let timedOut = false
    const timer = setTimeout(() => {
      timedOut = true
      killGroup()
    }, spec.timeoutMs)
    const abort = killGroup
    spec.signal?.addEventListener('abort', abort, { once: true })
    const code = await new Promise<number | null>((resolve, reject) => {
      child.once('error', reject)
      child.once('close', (status) => resolve(status))
    }).finally(() => {
      clearTimeout(timer)
      spec.signal?.removeEventListener('abort', abort)
    })
    if (spec.signal?.aborted) throw spec.signal.reason
    const what = spec.command.slice(0, 2).join(' ')
    if (timedOut) throw new CairnProblem('timeout', `image step '${what}' ran past ${spec.timeoutMs} ms`)
    if (code !== 0)
      throw new CairnProblem(
        'build_failed',
        `image step '${what}' exited with code ${code}${tail.length ? `: ${tail.join(' / ')}` : ''}`,
      )
  } finally {
    await proxy.close().catch(() => undefined)
    await rm(dir, { recursive: true, force: true })
  }
}
