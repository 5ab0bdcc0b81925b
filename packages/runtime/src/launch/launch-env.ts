import path from 'node:path'
import type { SandboxBind } from '../sandbox/driver.js'

/** How a sandbox finds the dependency environment mounted at /env. */
export const ENV_VARIABLES: Readonly<Record<string, string>> = {
  NODE_PATH: '/env/node_modules',
  PYTHONPATH: '/env/python',
  PATH: '/env/node_modules/.bin:/env/python/bin:/usr/local/bin:/usr/bin:/bin',
}

/**
 * Mounts of a dependency environment: all of it at /env, and Node's packages at /node_modules so
 * that ES module resolution (which ignores NODE_PATH) finds them from /workspace.
 */
export function envBinds(envDir: string, envKey: string): SandboxBind[] {
  const binds: SandboxBind[] = [{ source: envDir, dest: '/env', readOnly: true }]
  if (envKey.startsWith('node-'))
    binds.push({ source: path.join(envDir, 'node_modules'), dest: '/node_modules', readOnly: true })
  return binds
}

/** A revision's dependency environment on the host: its key (`node-…`, `python-…`) and directory. */
export interface DependencyEnv {
  key: string
  dir: string
}

/**
 * The environment and mounts of anything launched for a revision (its agent, its build steps, a
 * session's setup): the dependency environment's variables and mounts when it has one, then the
 * caller's variables. Agents, builds and setup phases all start from this one place.
 */
export function launchEnvironment(
  dependencyEnv: DependencyEnv | undefined,
  env: Readonly<Record<string, string>> = {},
): { env: Record<string, string>; binds: SandboxBind[] } {
  return {
    env: { ...(dependencyEnv ? ENV_VARIABLES : {}), ...env },
    binds: dependencyEnv ? envBinds(dependencyEnv.dir, dependencyEnv.key) : [],
  }
}

/**
 * Variables pointing HTTP clients at the egress forwarder on the sandbox's loopback (an allowlist
 * is enforced behind it); loopback itself stays direct.
 */
export function egressProxyEnv(): Record<string, string> {
  const env: Record<string, string> = {}
  for (const name of ['HTTP_PROXY', 'HTTPS_PROXY', 'http_proxy', 'https_proxy'])
    env[name] = 'http://127.0.0.1:3128'
  env.NO_PROXY = 'localhost,127.0.0.1,::1'
  env.no_proxy = env.NO_PROXY
  return env
}

/**
 * Variables making TLS clients trust the egress CA (written to /run/cairn by the run dir): the
 * bundle for OpenSSL-based clients, the CA alone for Node's NODE_EXTRA_CA_CERTS.
 */
export function trustedCaEnv(): Record<string, string> {
  const env: Record<string, string> = {}
  for (const name of ['SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE'])
    env[name] = '/run/cairn/ca-bundle.pem'
  env.NODE_EXTRA_CA_CERTS = '/run/cairn/egress-ca.pem'
  return env
}

/** Kit paths come first; paths the launch brings (a dependency environment) follow them. */
export function joinSearchPath(kit: string, extra: string | undefined): string {
  return extra ? `${kit}:${extra}` : kit
}
