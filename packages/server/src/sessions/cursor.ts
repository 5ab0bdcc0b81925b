import { CairnProblem } from '@cairn/protocol'

/** Opaque list cursor: the (createdAt, id) of the last row of the previous page. */
export function encodeCursor(createdAt: string, id: string): string {
  return Buffer.from(`${createdAt}|${id}`, 'utf8').toString('base64url')
}

export function decodeCursor(cursor: string): { createdAt: string; id: string } {
  const text = Buffer.from(cursor, 'base64url').toString('utf8')
  const [createdAt, id] = text.split('|')
  if (!createdAt || !id || Number.isNaN(Date.parse(createdAt))) {
    throw new CairnProblem('validation_failed', 'invalid cursor')
  }
  return { createdAt, id }
}
