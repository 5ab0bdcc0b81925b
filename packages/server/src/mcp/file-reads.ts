import { CairnProblem } from '@cairn/protocol'
import type { WorkspaceService } from '../workspace/workspace-service.js'

/**
 * The most bytes one MCP read of a file returns (a tool's result and a resource's contents are
 * one JSON message each, held whole); a larger file is refused with `payload_too_large`, and
 * `GET /v1/sessions/{id}/files/content` streams it instead.
 */
export const MAX_MCP_READ_BYTES = 1024 * 1024

/** A file's bytes as MCP carries them: UTF-8 text when they are, base64 otherwise. */
export interface FileContent {
  size: number
  encoding: 'utf8' | 'base64'
  content: string
}

const strictUtf8 = new TextDecoder('utf-8', { fatal: true })

/** Reads a regular file of a workspace or snapshot through the files service, up to the cap. */
export async function readWorkspaceFile(
  workspace: WorkspaceService,
  tenantId: string,
  sessionId: string,
  path: Buffer,
  snapshotId: string | undefined,
  signal?: AbortSignal,
): Promise<FileContent> {
  const file = await workspace.files.openFile(tenantId, sessionId, path, snapshotId, {
    ...(signal ? { signal } : {}),
  })
  const tooLarge = () =>
    new CairnProblem(
      'payload_too_large',
      `the file is larger than the ${MAX_MCP_READ_BYTES} bytes an MCP read returns; download it with GET /v1/sessions/${sessionId}/files/content`,
      { limitBytes: MAX_MCP_READ_BYTES },
    )
  if (file.size > MAX_MCP_READ_BYTES) {
    file.stream.destroy()
    throw tooLarge()
  }
  const chunks: Buffer[] = []
  let size = 0
  for await (const chunk of file.stream) {
    size += (chunk as Buffer).length
    // The file may have grown since it was opened.
    if (size > MAX_MCP_READ_BYTES) {
      file.stream.destroy()
      throw tooLarge()
    }
    chunks.push(chunk as Buffer)
  }
  const bytes = Buffer.concat(chunks)
  try {
    return { size, encoding: 'utf8', content: strictUtf8.decode(bytes) }
  } catch {
    return { size, encoding: 'base64', content: bytes.toString('base64') }
  }
}
