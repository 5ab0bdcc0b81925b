const SECOND = 1000
const MINUTE = 60 * SECOND
const HOUR = 60 * MINUTE
const DAY = 24 * HOUR

const RELATIVE_UNITS: ReadonlyArray<readonly [limitMs: number, unitMs: number, name: string]> = [
  [MINUTE, SECOND, 'second'],
  [HOUR, MINUTE, 'minute'],
  [DAY, HOUR, 'hour'],
  [30 * DAY, DAY, 'day'],
  [365 * DAY, 30 * DAY, 'month'],
  [Number.POSITIVE_INFINITY, 365 * DAY, 'year'],
]

/** "just now", "42 seconds ago", "1 minute ago", "3 hours ago", "2 days ago", "4 months ago" (or "in 5 minutes"). */
export function relativeTime(when: string | Date, now: Date = new Date()): string {
  const at = typeof when === 'string' ? new Date(when) : when
  const diff = now.getTime() - at.getTime()
  if (Number.isNaN(diff)) return '-'
  const abs = Math.abs(diff)
  if (abs < 5 * SECOND) return 'just now'
  const [, unitMs, name] = RELATIVE_UNITS.find(([limit]) => abs < limit) as (typeof RELATIVE_UNITS)[number]
  const count = Math.floor(abs / unitMs)
  const amount = `${count} ${name}${count === 1 ? '' : 's'}`
  return diff >= 0 ? `${amount} ago` : `in ${amount}`
}

/** A turn's duration, always in seconds: "0.3s", "1.2s", "75.0s" (as `Completed in 1.2s`). */
export function formatSeconds(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) return '-'
  return `${(ms / SECOND).toFixed(1)}s`
}

/** "850ms", "1.2s", "2m 5s", "1h 3m", "30d", "2d 4h". */
export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) return '-'
  if (ms < SECOND) return `${Math.round(ms)}ms`
  if (ms < MINUTE) return `${(Math.floor(ms / 100) / 10).toFixed(1)}s`
  if (ms < HOUR) return `${Math.floor(ms / MINUTE)}m ${Math.floor((ms % MINUTE) / SECOND)}s`
  if (ms < DAY) return `${Math.floor(ms / HOUR)}h ${Math.floor((ms % HOUR) / MINUTE)}m`
  const hours = Math.floor((ms % DAY) / HOUR)
  return `${Math.floor(ms / DAY)}d${hours > 0 ? ` ${hours}h` : ''}`
}

/** "512 B", "1.5 KB", "12.3 MB". */
export function formatBytes(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`
  const units = ['KB', 'MB', 'GB', 'TB']
  let value = bytes / 1024
  let unit = 0
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024
    unit++
  }
  return `${value.toFixed(1)} ${units[unit]}`
}

const UNITS: Record<string, number> = { ms: 1, s: SECOND, m: MINUTE, h: HOUR, d: DAY }

/**
 * "90s", "5m", "1h", "1.5h", "2d", "250ms", or "0"; `undefined` for anything else. A bare number
 * other than 0 is refused rather than guessed: one product reads `3600` as seconds, another as
 * milliseconds, and a guess off by 1000 turns an hour into 3.6 seconds.
 */
export function parseDuration(text: string): number | undefined {
  const match = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?$/i.exec(text.trim())
  if (!match) return undefined
  const unit = match[2]?.toLowerCase()
  if (unit === undefined) return Number(match[1]) === 0 ? 0 : undefined
  const ms = Math.round(Number(match[1]) * (UNITS[unit] ?? 1))
  return Number.isSafeInteger(ms) ? ms : undefined
}

/** Whether `text` is a bare number (a duration without its unit), for the error that says so. */
export function isBareNumber(text: string): boolean {
  return /^\d+(?:\.\d+)?$/.test(text.trim())
}
