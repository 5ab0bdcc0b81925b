import http from 'node:http'
import { rssMiB, type ServerProcess } from './server-process.js'

/**
 * How much the server's memory may grow while an agent floods a turn: a sandbox's start (~15 MiB),
 * the turn's bounded buffers (256 KiB of events not yet written, the runtime's queue of 256 Ki
 * characters, the socket's writes, a frame or reply of up to 8 Mi characters) and V8's room for
 * garbage at a flood's allocation rate (its young generation, 2 × 16 MiB, and the old space it lets
 * grow between full collections: up to 103 MiB measured with every event promoted,
 * `--max-semi-space-size=1`). 14–28 MiB measured for a jsonl agent's tool frames; a server that
 * kept the flood grew 307 MiB in 8 s.
 */
export const FLOOD_RSS_GROWTH_BOUND_MIB = 128

/** A turn's stream whose client reads it slowly: see `slowTurn`. */
export interface SlowTurn {
  /** Settles when the server ends the stream (or the request fails). */
  closed: Promise<void>
  /** Bytes of the stream read so far. */
  readonly received: number
  /** Reads whatever comes from now on, as fast as it comes. */
  readAll(): void
  stop(): void
}

/**
 * Sends `prompt` to session `sessionId` of `server` and reads the turn's stream at `bytesPerSecond`
 * (0: nothing), a tenth of it every 100 ms.
 */
export function slowTurn(
  server: Pick<ServerProcess, 'url' | 'key'>,
  sessionId: string,
  bytesPerSecond: number,
  prompt = 'flood',
): SlowTurn {
  let received = 0
  let timer: NodeJS.Timeout | undefined
  let response: http.IncomingMessage | undefined
  const request = http.request(`${server.url}/v1/sessions/${sessionId}/messages`, {
    method: 'POST',
    headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' },
  })
  const closed = new Promise<void>((resolve) => {
    request.on('error', () => resolve())
    request.on('response', (res) => {
      response = res
      res.pause()
      res.on('error', () => resolve())
      res.on('close', () => resolve())
      if (bytesPerSecond > 0)
        timer = setInterval(() => {
          received += res.read(Math.max(1, bytesPerSecond / 10))?.length ?? 0
        }, 100)
    })
  })
  request.end(JSON.stringify({ prompt }))
  return {
    closed: closed.finally(() => clearInterval(timer)),
    get received() {
      return received
    },
    readAll() {
      response?.resume()
    },
    stop() {
      clearInterval(timer)
      request.destroy()
    },
  }
}

/**
 * The highest resident memory of process `pid` in each of `parts` equal spans of `ms`, in MiB
 * (sampled every 200 ms).
 */
export async function peakRss(pid: number, ms: number, parts = 1): Promise<number[]> {
  const peaks = new Array<number>(parts).fill(0)
  const start = Date.now()
  for (let now = start; now < start + ms; now = Date.now()) {
    const part = Math.min(parts - 1, Math.floor(((now - start) / ms) * parts))
    peaks[part] = Math.max(peaks[part] ?? 0, rssMiB(pid))
    await new Promise((resolve) => setTimeout(resolve, 200))
  }
  return peaks
}
