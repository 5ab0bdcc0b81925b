import { readFile, readlink } from 'node:fs/promises'

const TCP_LISTEN = '0A'

/**
 * TCP ports listening in the network namespace of process `pid`: `/proc/<pid>/net/tcp{,6}` show the
 * sockets of that process's namespace, so no namespace needs to be entered to list them.
 */
export async function listeningPorts(pid: number): Promise<number[]> {
  const ports = new Set<number>()
  for (const file of ['tcp', 'tcp6']) {
    const text = await readFile(`/proc/${pid}/net/${file}`, 'utf8').catch(() => '')
    for (const line of text.split('\n').slice(1)) {
      const fields = line.trim().split(/\s+/)
      const local = fields[1]
      if (!local || fields[3] !== TCP_LISTEN) continue
      const port = Number.parseInt(local.split(':')[1] ?? '', 16)
      if (Number.isInteger(port) && port > 0) ports.add(port)
    }
  }
  return [...ports].sort((a, b) => a - b)
}

/**
 * A process in the sandbox's own network namespace: the outer bwrap stays in the host's, its
 * first child (the sandbox's pid 1) is in the new one. Undefined when none is found (yet).
 */
export async function sandboxNetworkPid(outerPid: number): Promise<number | undefined> {
  // Unreadable /proc entries mean "not found (yet)": the caller polls, and undefined says so.
  const host = await readlink('/proc/self/ns/net').catch(() => undefined)
  const children = await readFile(`/proc/${outerPid}/task/${outerPid}/children`, 'utf8').catch(() => '')
  for (const child of children.trim().split(/\s+/).filter(Boolean)) {
    // A child that exited meanwhile is not the one sought: the next child (or poll) is looked at.
    const ns = await readlink(`/proc/${child}/ns/net`).catch(() => undefined)
    if (ns && ns !== host) return Number(child)
  }
  return undefined
}
