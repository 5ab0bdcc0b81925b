import { CairnProblem } from '@cairn/protocol'
import type { RuntimePort, TurnInput, TurnMessage, TurnOptions } from '@cairn/runtime/port'

const FENCED_MESSAGE =
  'the node fenced itself (it could not renew its lease in the cluster database) and stopped its sandboxes while this turn ran'

/**
 * The port as a node serves it: a turn whose sandbox the node's own fence stopped (the fence
 * generation moved while it ran) ends `failed` with `node_fenced`, not with the agent crash the
 * stop looks like from inside, so nobody chases a bug in their agent. Every other call is the
 * port's own.
 */
export function reportFencedTurns(port: RuntimePort, fenceGeneration: () => number): RuntimePort {
  const runTurn = (
    sessionId: string,
    input: TurnInput,
    options?: TurnOptions,
  ): AsyncIterable<TurnMessage> => ({
    async *[Symbol.asyncIterator]() {
      const before = fenceGeneration()
      const fenced = () => fenceGeneration() !== before
      try {
        for await (const message of port.runTurn(sessionId, input, options)) {
          if (message.type === 'outcome' && message.outcome.status === 'failed' && fenced()) {
            const { text, stderr } = message.outcome
            yield {
              ...message,
              outcome: {
                status: 'failed',
                code: 'node_fenced',
                cause: 'node_lost',
                message: FENCED_MESSAGE,
                text,
                stderr,
              },
            }
            continue
          }
          yield message
        }
      } catch (error) {
        if (fenced()) throw new CairnProblem('node_fenced', FENCED_MESSAGE)
        throw error
      }
    },
  })
  return new Proxy(port, {
    get(target, property, receiver) {
      if (property === 'runTurn') return runTurn
      const value = Reflect.get(target, property, receiver)
      return typeof value === 'function' ? value.bind(target) : value
    },
  })
}
