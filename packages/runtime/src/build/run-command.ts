import path from 'node:path'
import { StringDecoder } from 'node:string_decoder'
import { newId } from '@cairn/protocol'
import { EgressProxy, type EgressRoute } from '../egress/proxy.js'
import { forwarderCommand } from '../egress/transparent.js'
import { egressProxyEnv } from '../launch/launch-env.js'
import type { SandboxBind, SandboxDriver, SandboxLimits } from '../sandbox/driver.js'
import type { Logger } from '../util/logger.js'

export interface CommandSpec {
  workspaceDir: string
  /** Host directory mounted read-only at /run/cairn. */
  runDir: string
  command: readonly string[]
  env: Readonly<Record<string, string>>
  binds: readonly SandboxBind[]
  /** A writable home of the sandbox's own (`SandboxSpec.home`). */
  home?: string | undefined
  /** The image's root filesystem (`SandboxSpec.rootfs`); unset: the host's /usr. */
  rootfs?: string | undefined
  limits: SandboxLimits
  timeoutMs: number
  /** Called with every complete output line (stdout and stderr interleaved as they arrive). */
  onLine: (line: string) => void
  /** Stops the command (its sandbox is destroyed); the result then says `cancelled`. */
  signal?: AbortSignal | undefined
  /**
   * The command's way out: an allowlist enforced by an egress proxy on a socket in `runDir` (as for
   * agents: a forwarder on the sandbox's loopback, `HTTP(S)_PROXY` pointing at it). Without one (or
   * with an empty allowlist) it has loopback only. Either way the sandbox has a network namespace of
   * its own, never the host's.
   */
  egress?: EgressRoute | undefined
  /** Where failures that do not change the result are reported (the runtime's logger). */
  logger?: Logger | undefined
}

export interface CommandResult {
  code: number | null
  signal: NodeJS.Signals | null
  limit: 'memory' | 'pids' | undefined
  timedOut: boolean
  cancelled?: boolean | undefined
}

/** Runs one command to completion in a fresh sandbox (build steps, setup commands). */
export async function runSandboxedCommand(driver: SandboxDriver, spec: CommandSpec): Promise<CommandResult> {
  const proxy =
    spec.egress && spec.egress.policy.allow.length > 0
      ? new EgressProxy({ ...spec.egress, socketPath: path.join(spec.runDir, 'egress.sock') })
      : undefined
  try {
    await proxy?.listen()
    return await runInSandbox(driver, spec, proxy !== undefined)
  } finally {
    // The command has ended (or failed) already: a proxy that fails to close changes no result.
    await proxy
      ?.close()
      .catch((error: unknown) =>
        spec.logger?.warn({ err: error, runDir: spec.runDir }, "closing a command's egress proxy failed"),
      )
  }
}

async function runInSandbox(
  driver: SandboxDriver,
  spec: CommandSpec,
  proxied: boolean,
): Promise<CommandResult> {
  const env: Record<string, string> = { ...spec.env, ...(proxied ? egressProxyEnv() : {}) }
  const transparent = proxied && driver.capabilities.transparentEgress
  const sandbox = await driver.start({
    id: newId('sandbox'),
    workspaceDir: spec.workspaceDir,
    runDir: spec.runDir,
    command:
      proxied && spec.egress ? forwarderCommand(spec.command, transparent, spec.egress.policy) : spec.command,
    env,
    limits: spec.limits,
    network: transparent ? 'egress' : 'none',
    binds: spec.binds,
    home: spec.home,
    rootfs: spec.rootfs,
  })
  sandbox.stdin.end()
  const pending = { stdout: '', stderr: '' }
  const forward = (stream: 'stdout' | 'stderr') => {
    const decoder = new StringDecoder('utf8')
    sandbox[stream].on('data', (chunk: Buffer) => {
      pending[stream] += decoder.write(chunk).replace(/\r(?!\n)/g, '\n')
      let newline = pending[stream].indexOf('\n')
      while (newline >= 0) {
        spec.onLine(pending[stream].slice(0, newline))
        pending[stream] = pending[stream].slice(newline + 1)
        newline = pending[stream].indexOf('\n')
      }
    })
  }
  forward('stdout')
  forward('stderr')
  let timedOut = false
  const timer = setTimeout(() => {
    timedOut = true
    void sandbox.destroy()
  }, spec.timeoutMs)
  const cancel = () => void sandbox.destroy()
  if (spec.signal?.aborted) cancel()
  spec.signal?.addEventListener('abort', cancel, { once: true })
  try {
    const exit = await sandbox.exited
    await new Promise((r) => setImmediate(r))
    for (const stream of ['stdout', 'stderr'] as const) if (pending[stream]) spec.onLine(pending[stream])
    const cancelled = spec.signal?.aborted === true
    return {
      code: exit.code,
      signal: exit.signal,
      limit: exit.limit,
      timedOut,
      ...(cancelled ? { cancelled } : {}),
    }
  } finally {
    clearTimeout(timer)
    spec.signal?.removeEventListener('abort', cancel)
    await sandbox.destroy()
  }
}
