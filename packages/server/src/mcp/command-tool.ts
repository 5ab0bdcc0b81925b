import { IdParams, StartCommandBody } from '@cairn/protocol'
import { Type } from '@sinclair/typebox'
import { COMMAND_WAIT_MS } from '../commands/command-service.js'
import { toCommandInfo } from '../commands/command-store.js'
import type { McpServices, ToolAnswer, ToolCall } from './tool-call.js'

/** The most of each stream (stdout, stderr) a result carries: its newest bytes. */
export const MAX_COMMAND_RESULT_BYTES = 512 * 1024
/** Bytes asked of the node per read. */
const READ_BYTES = 256 * 1024

const { command, env, cwd, timeoutMs } = StartCommandBody.properties

/**
 * `run_command`'s arguments: `POST /v1/sessions/{id}/commands`'s body without `stdin` (a tool call
 * has no way to write it: the command's stdin is closed, as `< /dev/null`).
 */
export const RunCommandInput = Type.Object(
  { sessionId: IdParams.properties.id, command, env, cwd, timeoutMs },
  { additionalProperties: false },
)

/** The newest bytes of a stream, up to the cap. */
class Tail {
  private chunks: Buffer[] = []
  private bytes = 0
  dropped = 0

  push(data: Buffer): void {
    this.chunks.push(data)
    this.bytes += data.length
    while (this.bytes > MAX_COMMAND_RESULT_BYTES) {
      const first = this.chunks[0] as Buffer
      const over = this.bytes - MAX_COMMAND_RESULT_BYTES
      if (first.length <= over) {
        this.chunks.shift()
        this.bytes -= first.length
        this.dropped += first.length
      } else {
        this.chunks[0] = first.subarray(over)
        this.bytes -= over
        this.dropped += over
      }
    }
  }

  text(): string {
    return Buffer.concat(this.chunks).toString('utf8')
  }
}

/**
 * Runs a command as `POST …/commands` starts it, and follows its output as `…/output` does (the
 * same reads by offset) to its exit: each chunk a progress notification, the result its exit
 * status with the newest 512 KiB of stdout and of stderr. A client that goes away stops the
 * following, not the command (it runs to its end or its timeout, its output kept on the node).
 */
export async function runCommand(
  services: McpServices,
  call: ToolCall,
  args: typeof RunCommandInput.static,
): Promise<ToolAnswer> {
  const { sessionId, ...body } = args
  const started = await services.commands.start(call.tenantId, sessionId, body)
  const out = { stdout: new Tail(), stderr: new Tail() }
  let offset = 0
  for (;;) {
    if (call.signal.aborted) throw call.signal.reason
    const { read, command: row } = await services.commands.read(
      call.tenantId,
      sessionId,
      started.id,
      offset,
      READ_BYTES,
      COMMAND_WAIT_MS,
    )
    for (const chunk of read?.chunks ?? []) {
      const data = Buffer.from(chunk.data)
      out[chunk.stream].push(data)
      void call.progress(data.toString('utf8'))?.catch(() => undefined)
    }
    if (read) offset = read.nextOffset
    if (row.status !== 'running' && (!read || offset >= Number(row.output_bytes))) {
      const info = toCommandInfo(row)
      const stdout = out.stdout.text()
      const stderr = out.stderr.text()
      return {
        structured: {
          command: info,
          stdout,
          stderr,
          ...(out.stdout.dropped + out.stderr.dropped > 0
            ? { truncated: { stdoutBytes: out.stdout.dropped, stderrBytes: out.stderr.dropped } }
            : {}),
        },
        text: `${stdout}${stderr}\n[${info.endCause ?? 'exit'}: ${info.exitCode ?? info.signal}]`,
      }
    }
  }
}
