import http from 'node:http'
import https from 'node:https'
import { isIP } from 'node:net'
import { CairnProblem } from '@cairn/protocol'
import { Webhook } from 'standardwebhooks'
import { bareHost, type WebhookAddressGuard } from './webhook-address.js'

/** How long an attempt may take, from connecting to the receiver's whole answer. */
export const WEBHOOK_TIMEOUT_MS = 10_000
/** Most of the receiver's answer read (the rest is not waited for). */
export const WEBHOOK_RESPONSE_CAP_BYTES = 64 * 1024

export interface WebhookRequest {
  url: string
  /** `whsec_…`: signs the message (Standard Webhooks). */
  secret: string
  messageId: string
  /** The body, as sent and signed. */
  payload: string
  at: Date
}

/** What one attempt came to: the receiver's status code, or why there was none that counted. */
export interface AttemptOutcome {
  ok: boolean
  statusCode: number | null
  error: string | null
  durationMs: number
}

/**
 * Sends one webhook request: signed per the Standard Webhooks specification (`webhook-id`,
 * `webhook-timestamp`, `webhook-signature`), through the address guard (checked again at each
 * connection), within `timeoutMs`, reading at most `responseCapBytes` of the answer, following no
 * redirect (a 3xx is not a delivery). Only a 2xx answer is a delivery.
 */
export class WebhookSender {
  constructor(
    private readonly guard: WebhookAddressGuard,
    private readonly timeoutMs = WEBHOOK_TIMEOUT_MS,
    private readonly responseCapBytes = WEBHOOK_RESPONSE_CAP_BYTES,
  ) {}

  async send(request: WebhookRequest): Promise<AttemptOutcome> {
    const started = performance.now()
    const outcome = (statusCode: number | null, error: string | null): AttemptOutcome => ({
      ok: statusCode !== null && statusCode >= 200 && statusCode < 300,
      statusCode,
      error,
      durationMs: Math.round(performance.now() - started),
    })
    try {
      const url = new URL(request.url)
      const host = bareHost(url)
      if (isIP(host)) this.guard.refuse(url, host)
      const statusCode = await this.post(url, request)
      return outcome(statusCode, statusCode >= 300 ? `the receiver answered ${statusCode}` : null)
    } catch (error) {
      const message =
        error instanceof CairnProblem ? `${error.code}: ${error.message}` : (error as Error).message
      return outcome(null, message)
    }
  }

  private post(url: URL, request: WebhookRequest): Promise<number> {
    const signature = new Webhook(request.secret).sign(request.messageId, request.at, request.payload)
    const body = Buffer.from(request.payload)
    const client = url.protocol === 'https:' ? https : http
    return new Promise((resolve, reject) => {
      const req = client.request(url, {
        method: 'POST',
        lookup: this.guard.lookupFor(url),
        agent: false,
        headers: {
          'content-type': 'application/json',
          'content-length': String(body.length),
          'user-agent': 'Cairn-Webhooks/1',
          'webhook-id': request.messageId,
          'webhook-timestamp': String(Math.floor(request.at.getTime() / 1000)),
          'webhook-signature': signature,
        },
      })
      const timer = setTimeout(
        () => req.destroy(new Error(`no answer within ${this.timeoutMs} ms`)),
        this.timeoutMs,
      )
      const settle = (fn: () => void) => {
        clearTimeout(timer)
        fn()
      }
      req.on('error', (error) => settle(() => reject(error)))
      req.on('response', (res) => {
        let read = 0
        res.on('data', (chunk: Buffer) => {
          read += chunk.length
          // The status is what counts: the rest of a large answer is not waited for.
          if (read >= this.responseCapBytes) {
            res.destroy()
            settle(() => resolve(res.statusCode ?? 0))
          }
        })
        res.on('end', () => settle(() => resolve(res.statusCode ?? 0)))
        res.on('error', (error) => settle(() => reject(error)))
      })
      req.end(body)
    })
  }
}
