import type { SessionInfo } from '@cairn/protocol'

/** One tab of the session page; `show()` runs each time it is selected (it reloads what it shows). */
export interface Panel {
  el: HTMLElement
  show(): void
  /** Called when another tab is selected. */
  hide?(): void
  /** Called when the session's info changes (status polling, an action). */
  onInfo?(info: SessionInfo): void
}

/** What the session page shares with its tabs. */
export interface SessionState {
  id: string
  info: SessionInfo | undefined
  /** Reloads the session's info (header and tabs). */
  refresh(): Promise<void>
  /** Opens the Files tab, on a snapshot when given. */
  browse(snapshotId?: string): void
}
