import { createHmac, timingSafeEqual } from 'node:crypto'
import { CairnProblem } from '@cairn/protocol'

/** Query parameters of a signed preview URL; the same token then travels in a path-scoped cookie. */
export const SIGNATURE_PARAM = 'cairn_signature'
export const EXPIRES_PARAM = 'cairn_expires'
export const PREVIEW_COOKIE = 'cairn_preview'

/**
 * Signs and checks preview tokens: an HMAC-SHA256 over the session, the port and the expiry, with
 * a key derived from the server's secret key, so a token grants one port of one session until it
 * expires and nothing else. Nothing is stored: a token cannot be revoked before it expires.
 */
export class PreviewSigner {
  constructor(private readonly key: Buffer) {}

  private mac(sessionId: string, port: number, expiresAtMs: number): string {
    return createHmac('sha256', this.key)
      .update(`preview.v1\n${sessionId}\n${port}\n${expiresAtMs}`)
      .digest('base64url')
  }

  sign(sessionId: string, port: number, expiresAtMs: number): string {
    return this.mac(sessionId, port, expiresAtMs)
  }

  /** Throws `forbidden` for a forged, foreign or expired token. */
  verify(sessionId: string, port: number, expiresAtMs: number, signature: string, nowMs: number): void {
    const expected = Buffer.from(this.mac(sessionId, port, expiresAtMs))
    const given = Buffer.from(signature)
    if (
      !Number.isSafeInteger(expiresAtMs) ||
      given.length !== expected.length ||
      !timingSafeEqual(given, expected)
    ) {
      throw new CairnProblem('forbidden', 'the preview signature is not valid for this session and port', {
        reason: 'invalid_signature',
      })
    }
    if (expiresAtMs <= nowMs) {
      throw new CairnProblem(
        'forbidden',
        `the preview URL expired at ${new Date(expiresAtMs).toISOString()}`,
        {
          reason: 'expired',
        },
      )
    }
  }
}
