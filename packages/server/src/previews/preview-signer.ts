import { createHmac, timingSafeEqual } from 'node:crypto'
import { CairnProblem } from '@cairn/protocol'

/** Query parameters of a signed preview URL; the same token then travels in a host-only cookie on the preview's origin. */
export const SIGNATURE_PARAM = 'cairn_signature'
export const EXPIRES_PARAM = 'cairn_expires'
export const EPOCH_PARAM = 'cairn_epoch'
export const PREVIEW_COOKIE = 'cairn_preview'

/** What a preview token is signed over; `epoch` is the port's revocation epoch when it was issued. */
export interface PreviewGrant {
  sessionId: string
  port: number
  expiresAtMs: number
  epoch: number
}

/**
 * Signs and checks preview tokens: an HMAC-SHA256 over the session, the port, the expiry and the
 * revocation epoch, with a key derived from the server's secret key, so a token grants one port of
 * one session until it expires or its epoch is no longer the port's current one, and nothing else.
 */
export class PreviewSigner {
  constructor(private readonly key: Buffer) {}

  // Epoch 0 signs exactly what tokens signed before revocation existed, so those stay valid.
  private mac({ sessionId, port, expiresAtMs, epoch }: PreviewGrant): string {
    return createHmac('sha256', this.key)
      .update(`preview.v1\n${sessionId}\n${port}\n${expiresAtMs}${epoch > 0 ? `\n${epoch}` : ''}`)
      .digest('base64url')
  }

  sign(grant: PreviewGrant): string {
    return this.mac(grant)
  }

  /**
   * Throws `forbidden` for a forged, foreign, revoked (its epoch is not `currentEpoch`) or expired
   * token, with `details.reason`.
   */
  verify(grant: PreviewGrant, signature: string, currentEpoch: number, nowMs: number): void {
    const { expiresAtMs, epoch } = grant
    const valid = Number.isSafeInteger(expiresAtMs) && Number.isSafeInteger(epoch) && epoch >= 0
    const expected = Buffer.from(valid ? this.mac(grant) : '')
    const given = Buffer.from(signature)
    if (!valid || given.length !== expected.length || !timingSafeEqual(given, expected)) {
      throw new CairnProblem('forbidden', 'the preview signature is not valid for this session and port', {
        reason: 'invalid_signature',
      })
    }
    if (epoch !== currentEpoch) {
      throw new CairnProblem(
        'forbidden',
        'the preview URL was revoked (DELETE …/ports/{port}/url, or the session ended); ask for a new one',
        { reason: 'revoked' },
      )
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
