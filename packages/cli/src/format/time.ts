const SECOND = 1000
const MINUTE = 60 * SECOND
const HOUR = 60 * MINUTE
const DAY = 24 * HOUR

/** "just now", "42s ago", "5m ago", "3h ago", "2d ago", "4mo ago", "1y ago" (or "in 5m" for the future). */
export function relativeTime(when: string | Date, now: Date = new Date()): string {
  const at = typeof when === 'string' ? new Date(when) : when
  const diff = now.getTime() - at.getTime()
  if (Number.isNaN(diff)) return '-'
  const abs = Math.abs(diff)
  if (abs < 5 * SECOND) return 'just now'
  let amount: string
  if (abs < MINUTE) amount = `${Math.floor(abs / SECOND)}s`
  else if (abs < HOUR) amount = `${Math.floor(abs / MINUTE)}m`
  else if (abs < DAY) amount = `${Math.floor(abs / HOUR)}h`
  else if (abs < 30 * DAY) amount = `${Math.floor(abs / DAY)}d`
  else if (abs < 365 * DAY) amount = `${Math.floor(abs / (30 * DAY))}mo`
  else amount = `${Math.floor(abs / (365 * DAY))}y`
  return diff >= 0 ? `${amount} ago` : `in ${amount}`
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

/** "90s", "5m", "1h", "1.5h", "2d", "250ms" or a bare number of milliseconds; `undefined` if it is none of these. */
export function parseDuration(text: string): number | undefined {
  const match = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?$/i.exec(text.trim())
  if (!match) return undefined
  const ms = Math.round(Number(match[1]) * (UNITS[(match[2] ?? 'ms').toLowerCase()] ?? 1))
  return Number.isSafeInteger(ms) ? ms : undefined
}
