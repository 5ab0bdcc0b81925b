import { execFile } from 'node:child_process'
import { CairnProblem, type ErrorCode } from '@cairn/protocol'
import { OWN_PROCESS_GROUP } from './process-group.js'

export interface ExecResult {
  stdout: string
  stderr: string
}

/** Runs a host tool (btrfs, mount …) and turns a failure into a typed problem with its stderr. */
export function execTool(
  file: string,
  args: readonly string[],
  options: { code?: ErrorCode; timeoutMs?: number } = {},
): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    execFile(
      file,
      args,
      {
        timeout: options.timeoutMs ?? 60_000,
        maxBuffer: 16 * 1024 * 1024,
        encoding: 'utf8',
        ...OWN_PROCESS_GROUP,
      },
      (error, stdout, stderr) => {
        if (error) {
          const detail = stderr.trim() || error.message
          reject(
            new CairnProblem(options.code ?? 'internal', `${file} ${args.join(' ')} failed: ${detail}`, {
              tool: file,
            }),
          )
          return
        }
        resolve({ stdout, stderr })
      },
    )
  })
}
