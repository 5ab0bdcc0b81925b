import { type AgentCard, AgentCard as AgentCardJson } from '@a2a-js/sdk'
import { LegacyJsonRpcTransportHandler } from '@a2a-js/sdk/compat/v0_3/server'
import { RequestMalformedError, VersionNotSupportedError } from '@a2a-js/sdk/errors'
import { type A2ARequestHandler, JsonRpcTransportHandler, ServerCallContext } from '@a2a-js/sdk/server'
import {
  A2ALegacySendParams,
  A2ALegacyTaskParams,
  A2ASendMessageParams,
  A2ATaskParams,
  type JsonRpcRequest,
} from '@cairn/protocol'
import type { TSchema } from '@sinclair/typebox'
import { TypeCompiler } from '@sinclair/typebox/compiler'
import { A2A_LEGACY_VERSION, A2A_VERSION } from './a2a-card.js'
import { type A2AScope, type A2AServices, CairnA2AHandler } from './a2a-handler.js'

// The A2A side of the routes in routes.ts: the official A2A library (its JSON-RPC transports, card
// encoding and errors) and the params checks, loaded by the first A2A request rather than by every
// server start (routes.ts imports this module when a request comes).

type ParamsCheck = ReturnType<typeof TypeCompiler.Compile<TSchema>>
type RpcTransport = Pick<JsonRpcTransportHandler, 'handle'>

/**
 * A version of A2A's JSON-RPC as served: the params each method is checked against before the
 * A2A library decodes them, the methods a read-only key may call, and the library's transport
 * handler and error encoding for that version (both answer with the same `CairnA2AHandler`).
 */
export interface Dialect {
  version: string
  params: Record<string, ParamsCheck>
  reads: Set<string>
  transport(handler: A2ARequestHandler): RpcTransport
  encodeError(error: unknown): unknown
}

export const V1: Dialect = {
  version: A2A_VERSION,
  params: {
    SendMessage: TypeCompiler.Compile(A2ASendMessageParams),
    SendStreamingMessage: TypeCompiler.Compile(A2ASendMessageParams),
    GetTask: TypeCompiler.Compile(A2ATaskParams),
    CancelTask: TypeCompiler.Compile(A2ATaskParams),
    SubscribeToTask: TypeCompiler.Compile(A2ATaskParams),
  },
  reads: new Set(['GetTask', 'SubscribeToTask', 'GetExtendedAgentCard', 'ListTasks']),
  transport: (handler) => new JsonRpcTransportHandler(handler),
  encodeError: (error) => JsonRpcTransportHandler.mapToJSONRPCError(error),
}

export const V03: Dialect = {
  version: A2A_LEGACY_VERSION,
  params: {
    'message/send': TypeCompiler.Compile(A2ALegacySendParams),
    'message/stream': TypeCompiler.Compile(A2ALegacySendParams),
    'tasks/get': TypeCompiler.Compile(A2ALegacyTaskParams),
    'tasks/cancel': TypeCompiler.Compile(A2ALegacyTaskParams),
    'tasks/resubscribe': TypeCompiler.Compile(A2ALegacyTaskParams),
  },
  reads: new Set(['tasks/get', 'tasks/resubscribe', 'agent/getAuthenticatedExtendedCard']),
  transport: (handler) => new LegacyJsonRpcTransportHandler(handler),
  encodeError: (error) => LegacyJsonRpcTransportHandler.mapToLegacyJSONRPCError(error),
}

/** The dialect a request asks for: no `A2A-Version` is 0.3 (the spec's rule), `1.0` is 1.0. */
export function dialectOf(header: string | string[] | undefined): Dialect | Error {
  const version = Array.isArray(header) ? header.at(-1) : header
  if (version === undefined || version === '0.3' || version === '0.3.0') return V03
  if (version === '1.0' || version === '1') return V1
  return new VersionNotSupportedError({
    message: `A2A version ${version} is not served: send A2A-Version: ${A2A_VERSION} (or none, for 0.3)`,
    metadata: { code: 'bad_request' },
  })
}

/** The card as JSON (the A2A library's encoding: its field names and enum spellings). */
export function cardBody(card: AgentCard): Record<string, unknown> {
  return AgentCardJson.toJSON(card) as Record<string, unknown>
}

/** Params the method cannot be served with (answered as a JSON-RPC error naming the path). */
export function paramsRefusal(dialect: Dialect, body: JsonRpcRequest): Error | undefined {
  // Own properties only: a method named `constructor` or `__proto__` is an unknown method.
  const check = Object.hasOwn(dialect.params, body.method) ? dialect.params[body.method] : undefined
  if (!check || check.Check(body.params)) return undefined
  const first = check.Errors(body.params).First()
  return new RequestMalformedError({
    message: `params${first?.path ?? ''}: ${first?.message ?? 'invalid'}`,
    metadata: { code: 'validation_failed' },
  })
}

/**
 * A JSON-RPC request answered by the library's transport for its dialect, on `CairnA2AHandler`: a
 * JSON-RPC response, or for the streaming methods the generator of its answers.
 */
export function answerRpc(deps: A2AServices, scope: A2AScope, dialect: Dialect, body: JsonRpcRequest) {
  const transport = dialect.transport(new CairnA2AHandler(deps, scope))
  return transport.handle(body, new ServerCallContext({ requestedVersion: dialect.version }))
}
