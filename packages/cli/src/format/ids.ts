import { shortId as protocolShortId } from '@cairn/protocol/core'

/** The 12-character form shown in tables and hints (`ses_` + 8): long enough to be a unique prefix. */
export function shortId(id: string): string {
  return protocolShortId(id)
}
