import { createServer, type IncomingMessage, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'

/** One output item of a Responses API response, as the wire has it (snake_case). */
export type ResponseItem = Record<string, unknown> & { type?: string }

/** A request the stand-in model received: the tools it was offered and the input it was given. */
export interface ModelRequest {
  model: string
  tools: { type: string; name?: string }[]
  input: ResponseItem[]
}

/**
 * A stand-in for the OpenAI Responses API on loopback (`POST /v1/responses`, not streamed): each
 * request is answered with the next planned output (tool calls the test wants the model to make),
 * and once the plan is used up with an assistant message `done`. It keeps every request, so a
 * test reads what the model was told (the tools' outputs) as the model would.
 */
export class StandInModel {
  readonly requests: ModelRequest[] = []
  private plan: ResponseItem[][] = []
  private server: Server | undefined
  private served = 0
  url = ''

  async start(): Promise<this> {
    this.server = createServer((request, response) => {
      void this.answer(request).then(
        (body) => response.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body)),
        (error: Error) =>
          response
            .writeHead(400, { 'content-type': 'application/json' })
            .end(JSON.stringify({ error: { message: error.message, type: 'invalid_request_error' } })),
      )
    })
    await new Promise<void>((resolve) => this.server?.listen(0, '127.0.0.1', resolve))
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1`
    return this
  }

  /** What the next responses hold, one entry a response; after them the model says `done`. */
  will(...responses: ResponseItem[][]): void {
    this.plan = responses
  }

  /** The outputs of the tool calls the model got back, by call ID (from every request). */
  toolOutputs(): Map<string, ResponseItem> {
    const outputs = new Map<string, ResponseItem>()
    for (const request of this.requests)
      for (const item of request.input)
        if (item.type?.endsWith('_call_output')) outputs.set(String(item.call_id), item)
    return outputs
  }

  async close(): Promise<void> {
    this.server?.closeAllConnections()
    await new Promise((resolve) => this.server?.close(resolve))
  }

  private async answer(request: IncomingMessage): Promise<Record<string, unknown>> {
    if (request.method !== 'POST' || request.url !== '/v1/responses')
      throw new Error(`the stand-in answers POST /v1/responses only, not ${request.method} ${request.url}`)
    const chunks: Buffer[] = []
    for await (const chunk of request) chunks.push(chunk as Buffer)
    const body = JSON.parse(Buffer.concat(chunks).toString()) as ModelRequest & { stream?: boolean }
    if (body.stream) throw new Error('the stand-in does not stream')
    this.requests.push(body)
    const n = ++this.served
    const output = this.plan.shift() ?? [message(`msg_${n}`, 'done')]
    return {
      id: `resp_${n}`,
      object: 'response',
      created_at: Math.floor(Date.now() / 1000),
      status: 'completed',
      model: body.model,
      output,
      error: null,
      incomplete_details: null,
      usage: {
        input_tokens: 1,
        output_tokens: 1,
        total_tokens: 2,
        input_tokens_details: { cached_tokens: 0 },
        output_tokens_details: { reasoning_tokens: 0 },
      },
    }
  }
}

const message = (id: string, text: string): ResponseItem => ({
  type: 'message',
  id,
  role: 'assistant',
  status: 'completed',
  content: [{ type: 'output_text', text, annotations: [] }],
})

/** The model calls the shell tool with these command lines. */
export function shellCall(
  callId: string,
  commands: string[],
  limits: { timeoutMs?: number; maxOutputLength?: number } = {},
): ResponseItem {
  return {
    type: 'shell_call',
    id: `sh_${callId}`,
    call_id: callId,
    status: 'completed',
    action: {
      commands,
      timeout_ms: limits.timeoutMs ?? null,
      max_output_length: limits.maxOutputLength ?? null,
    },
  }
}

/** The model calls the apply_patch tool with this operation (`create_file`, `update_file`, `delete_file`). */
export function patchCall(callId: string, operation: Record<string, string>): ResponseItem {
  return { type: 'apply_patch_call', id: `ap_${callId}`, call_id: callId, status: 'completed', operation }
}
