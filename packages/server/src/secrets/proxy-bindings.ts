import { CairnProblem, type NetworkPolicy } from '@cairn/protocol'
import { bindingAllowed } from '@cairn/runtime/port'

/** A proxy secret's host binding the agent's allowlist lets no connection through to. */
export interface UnreachableBinding {
  secret: string
  host: string
}

/** The bindings of `secrets` that `network` (an agent's `network`, none: nothing allowed) cannot reach. */
export function unreachableBindings(
  secrets: readonly { name: string; hosts?: readonly string[] | undefined }[],
  network: NetworkPolicy | undefined,
): UnreachableBinding[] {
  const policy = network ?? { allow: [] }
  return secrets.flatMap((secret) =>
    (secret.hosts ?? [])
      .filter((host) => !bindingAllowed(policy, host))
      .map((host) => ({ secret: secret.name, host })),
  )
}

/**
 * Refuses proxy secrets bound to hosts the allowlist does not allow: the agent could never send
 * them anywhere, and without this nothing would say so (its requests are simply denied).
 */
export function assertBindingsAllowed(
  code: 'invalid_manifest' | 'validation_failed',
  unreachable: readonly UnreachableBinding[],
  where: string,
): void {
  const [first] = unreachable
  if (!first) return
  const more =
    unreachable.length > 1 ? ` (all: ${unreachable.map((b) => `${b.secret} → ${b.host}`).join(', ')})` : ''
  throw new CairnProblem(
    code,
    `proxy secret ${first.secret} is bound to ${first.host}, which ${where} does not allow${more}: the agent could never send it there; add the host to network.allow or bind the secret to an allowed host`,
    { secret: first.secret, host: first.host, unreachable: [...unreachable] },
  )
}
