import { mkdirSync, rmSync, writeFileSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import path from 'node:path'

/**
 * One file per session frozen in place (a resident pause), under the data dir: it outlives a
 * server that stops or dies while the sandbox is frozen, so that session's next message says why
 * its memory is gone instead of starting cold silently. Written when the sandbox is frozen,
 * removed when it thaws, is released or is dropped.
 */
export class ResidentMarkers {
  constructor(private readonly dir: string) {}

  /** Marks the session frozen now (synchronous: it is there before the freeze is reported). */
  mark(sessionId: string, driver: string, frozenAtMs: number): void {
    mkdirSync(this.dir, { recursive: true })
    const marker: ResidentMarker = { driver, frozenAt: new Date(frozenAtMs).toISOString() }
    writeFileSync(this.file(sessionId), JSON.stringify(marker))
  }

  /** Synchronous too: a thaw's clear cannot land after the next freeze's mark. */
  clear(sessionId: string): void {
    rmSync(this.file(sessionId), { force: true })
  }

  /**
   * Removes the session's marker and says why its memory was lost, if one was left: the server
   * stopped (or died) while its sandbox was frozen and no checkpoint was taken of it.
   */
  async lost(sessionId: string): Promise<string | undefined> {
    const text = await readFile(this.file(sessionId), 'utf8').catch(() => undefined)
    if (text === undefined) return undefined
    this.clear(sessionId)
    let marker: Partial<ResidentMarker> = {}
    try {
      marker = JSON.parse(text) as Partial<ResidentMarker>
    } catch {
      // An unreadable marker still says the sandbox was frozen: the reason goes without its details.
    }
    const why =
      marker.driver === 'bwrap' ? 'bwrap keeps no checkpoint of a sandbox' : 'no checkpoint of it was taken'
    return `memory lost, started cold: its sandbox was frozen in place (a resident pause${marker.driver ? `, ${marker.driver}` : ''}${marker.frozenAt ? ` since ${marker.frozenAt}` : ''}) when the server stopped, and ${why}`
  }

  private file(sessionId: string): string {
    return path.join(this.dir, `${path.basename(sessionId)}.json`)
  }
}

interface ResidentMarker {
  driver: string
  frozenAt: string
}
