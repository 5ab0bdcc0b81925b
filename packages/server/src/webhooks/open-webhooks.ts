import type { Logger } from 'pino'
import type { Clock } from '../clock.js'
import type { ResolvedConfig } from '../config.js'
import type { Db } from '../db/database.js'
import type { SecretCipher } from '../secrets/cipher.js'
import { WebhookAddressGuard } from './webhook-address.js'
import { WebhookDeliverer } from './webhook-deliverer.js'
import { WebhookSender } from './webhook-sender.js'
import { WebhookStore } from './webhook-store.js'

export interface Webhooks {
  store: WebhookStore
  deliverer: WebhookDeliverer
  /** Called once the server listens: its ports join the guard, and delivery starts. */
  listening(ports: number[]): void
}

/** The webhook endpoints, their guard and the deliverer (started once the server listens). */
export function openWebhooks(
  config: Pick<ResolvedConfig, 'webhookAllowCidrs' | 'webhookTiming'>,
  deps: { db: Db; clock: Clock; logger: Logger; cipher: SecretCipher },
): Webhooks {
  const ownPorts: number[] = []
  const guard = new WebhookAddressGuard(config.webhookAllowCidrs, () => ownPorts)
  const store = new WebhookStore(deps.db, deps.clock, guard, deps.cipher.deriveKey('webhook-signing'))
  const deliverer = new WebhookDeliverer({
    db: deps.db,
    clock: deps.clock,
    logger: deps.logger.child({ component: 'webhooks' }),
    sender: new WebhookSender(guard),
    secretOf: (id) => store.secretOf(id),
    pollMs: config.webhookTiming.pollMs,
    retryBaseMs: config.webhookTiming.retryBaseMs,
  })
  return {
    store,
    deliverer,
    listening(ports) {
      ownPorts.push(...ports)
      deliverer.start()
    },
  }
}
