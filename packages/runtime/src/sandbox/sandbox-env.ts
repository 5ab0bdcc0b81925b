import type { SandboxSpec } from './driver.js'
import { SANDBOX_USER } from './rootfs.js'

/**
 * The whole environment of a sandbox's first process: a few fixed variables, then the spec's.
 * Nothing of the host's environment reaches the sandbox. The bwrap driver builds the same set.
 */
export function sandboxEnv(spec: Pick<SandboxSpec, 'env'>): Record<string, string> {
  return {
    PATH: '/usr/local/bin:/usr/bin:/bin',
    HOME: SANDBOX_USER.home,
    USER: SANDBOX_USER.name,
    LANG: 'C.UTF-8',
    TMPDIR: '/tmp',
    ...spec.env,
  }
}

/**
 * The same environment as the agent sees it under bwrap, which adds PWD for its `--chdir`: for
 * drivers that start the agent themselves in /workspace.
 */
export function sandboxEnvInWorkspace(spec: Pick<SandboxSpec, 'env'>): Record<string, string> {
  return { ...sandboxEnv(spec), PWD: '/workspace' }
}
