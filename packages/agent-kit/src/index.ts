/** Paths of the agent-kit files the runtime mounts into every sandbox at /opt/cairn. */
export const SANDBOX_KIT_ROOT = '/opt/cairn'
export const SHIM_PATHS = {
  python: '/opt/cairn/shims/python',
  node: '/opt/cairn/shims/node/stdio.cjs',
  bash: '/opt/cairn/shims/bash/stdio.sh',
} as const

// The jsonl-protocol kit for Node agents (plain JS in ../node, which sandboxes see at
// /opt/cairn/node): `for await (const turn of turns())`.
export type { ToolEndOptions, TranscriptLine } from '../node/index.mjs'
export { currentTurn, Turn, tool, transcript, turns } from '../node/index.mjs'
