/** How long a connection to the store may take to open before the attempt is given up. */
export const S3_CONNECT_TIMEOUT_MS = 5_000
/**
 * How long a request may go with nothing sent or received (the store took no byte of a body and
 * sent none of its answer) before the attempt is given up. A hung store (it accepts connections and
 * never answers) costs an attempt this long; a slow but moving transfer of a large part is not cut
 * by it (`S3_MIN_BYTES_PER_SECOND` bounds that one).
 */
export const S3_IDLE_TIMEOUT_MS = 10_000
/** Attempts per bucket call: the SDK retries a timeout, a refused connection or a 5xx with backoff. */
export const S3_MAX_ATTEMPTS = 3
/**
 * The slowest a call's bytes may move, on average over the call: past `bucketCallBoundMs` plus
 * its bytes at this rate, the call is given up (`shipping_failed`). 256 KiB/s (2 Mbit/s) moves a
 * 64 MiB part in 256 s; the idle timeout alone let a store that sends a byte now and then hold a
 * ship or a restore for ever.
 */
export const S3_MIN_BYTES_PER_SECOND = 256 * 1024

/**
 * How long one bucket call can take at most against a store that never answers: every attempt's
 * idle timeout, plus the SDK's backoff between attempts (under a second each at these counts).
 */
export function bucketCallBoundMs(
  idleTimeoutMs = S3_IDLE_TIMEOUT_MS,
  connectTimeoutMs = S3_CONNECT_TIMEOUT_MS,
): number {
  return S3_MAX_ATTEMPTS * (Math.max(idleTimeoutMs, connectTimeoutMs) + 1_000)
}

/** What bounds one bucket call: its fixed part, and the slowest its bytes may move. */
export interface BucketBounds {
  callBoundMs: number
  minBytesPerSecond: number
}

export const DEFAULT_BUCKET_BOUNDS: BucketBounds = {
  callBoundMs: bucketCallBoundMs(),
  minBytesPerSecond: S3_MIN_BYTES_PER_SECOND,
}

/**
 * One bucket call's deadline, `callBoundMs` plus its bytes at `minBytesPerSecond` from its start:
 * a signal for the SDK (which aborts the request and does not retry it), and, once an answer's
 * length is known from its headers, its body cut when the deadline passes.
 */
export class CallDeadline {
  private readonly controller = new AbortController()
  private readonly startedAt = Date.now()
  private timer: NodeJS.Timeout | undefined
  private body: { destroy?: (error?: Error) => void } | undefined

  constructor(
    private readonly bounds: BucketBounds,
    bytes = 0,
  ) {
    this.arm(bytes)
  }

  get signal(): AbortSignal {
    return this.controller.signal
  }

  get passed(): boolean {
    return this.controller.signal.aborted
  }

  /** Why the call was given up, once it passed its deadline. */
  get reason(): string {
    const reason: unknown = this.controller.signal.reason
    return reason instanceof Error ? reason.message : 'the call passed its deadline'
  }

  /** The deadline for `bytes` (in ms from the call's start). */
  deadlineMs(bytes: number): number {
    return this.bounds.callBoundMs + Math.ceil((bytes * 1000) / this.bounds.minBytesPerSecond)
  }

  /** The answer is `bytes` long: the deadline becomes theirs, and `body` is cut when it passes. */
  answer(bytes: number, body: unknown): void {
    this.body = body as { destroy?: (error?: Error) => void }
    this.arm(bytes)
  }

  done(): void {
    clearTimeout(this.timer)
  }

  private arm(bytes: number): void {
    clearTimeout(this.timer)
    const leftMs = Math.max(0, this.startedAt + this.deadlineMs(bytes) - Date.now())
    this.timer = setTimeout(() => {
      const moving =
        bytes > 0 ? `${bytes} bytes at under ${this.bounds.minBytesPerSecond} bytes/s` : 'no answer'
      const error = new Error(`the call passed its deadline of ${this.deadlineMs(bytes)} ms (${moving})`)
      this.controller.abort(error)
      // Destroyed with an error: the SDK's collector of the body rejects on it (without, it waited).
      this.body?.destroy?.(error)
    }, leftMs)
    this.timer.unref()
  }
}
