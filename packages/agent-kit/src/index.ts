/** Paths of the agent-kit files the runtime mounts into every sandbox at /opt/cairn. */
export const SANDBOX_KIT_ROOT = '/opt/cairn'
export const SHIM_PATHS = {
  python: '/opt/cairn/shims/python',
  node: '/opt/cairn/shims/node/stdio.cjs',
  bash: '/opt/cairn/shims/bash/stdio.sh',
} as const
