import { readFileSync } from 'node:fs'

export interface MountEntry {
  mountPoint: string
  fsType: string
  source: string
  options: string
}

/** Decodes the octal escapes (`\040` for a space …) that /proc/self/mountinfo uses in paths. */
function unescapeMountPath(value: string): string {
  return value.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(Number.parseInt(octal, 8)))
}

export function readMounts(): MountEntry[] {
  const text = readFileSync('/proc/self/mountinfo', 'utf8')
  const entries: MountEntry[] = []
  for (const line of text.split('\n')) {
    if (!line) continue
    const [left, right] = line.split(' - ')
    if (!left || !right) continue
    const fields = left.split(' ')
    const [fsType, source] = right.split(' ')
    entries.push({
      mountPoint: unescapeMountPath(fields[4] ?? ''),
      fsType: fsType ?? '',
      source: unescapeMountPath(source ?? ''),
      options: fields[5] ?? '',
    })
  }
  return entries
}

export function findMount(mountPoint: string): MountEntry | undefined {
  return readMounts().find((m) => m.mountPoint === mountPoint)
}
