import { CairnProblem } from '@cairn/protocol'
import type {
  ListResourcesResult,
  ListResourceTemplatesResult,
  ReadResourceResult,
} from '@modelcontextprotocol/sdk/types.js'
import { workspaceRelativeBytes } from '../files/confine.js'
import { readWorkspaceFile } from './file-reads.js'
import type { McpServices } from './tool-call.js'

/**
 * A session's transcript and files as MCP resources:
 * `cairn://sessions/{sessionId}/transcript` (its messages, JSON) and
 * `cairn://sessions/{sessionId}/files/{path}` (a file; a path that is empty or ends in `/` is a
 * directory, listed as JSON). Read through the services the native routes call, for the key's tenant.
 */
const PREFIX = 'cairn://sessions/'
const URI = /^cairn:\/\/sessions\/([^/]+)\/(transcript|files\/(.*))$/s
/** Sessions listed per page of `resources/list` (each gives its transcript and its files' root). */
const SESSIONS_PER_PAGE = 50

export const RESOURCE_TEMPLATES: ListResourceTemplatesResult['resourceTemplates'] = [
  {
    uriTemplate: `${PREFIX}{sessionId}/transcript`,
    name: 'transcript',
    title: "A session's transcript",
    description: 'Every message of the session (user and assistant), with its turn, as JSON.',
    mimeType: 'application/json',
  },
  {
    uriTemplate: `${PREFIX}{sessionId}/files/{+path}`,
    name: 'file',
    title: "A file of a session's workspace",
    description:
      'A file under /workspace (text, or bytes as a blob, up to 1 MiB); a path ending in / lists that directory as JSON.',
  },
]

/** The URI of a file (or, with a trailing `/`, a directory) of a session's workspace. */
export function fileUri(sessionId: string, path: string): string {
  return `${PREFIX}${sessionId}/files/${path.split('/').map(encodeURIComponent).join('/')}`
}

export async function listResources(
  services: McpServices,
  tenantId: string,
  cursor: string | undefined,
): Promise<ListResourcesResult> {
  const page = await services.sessions.list(tenantId, {
    limit: SESSIONS_PER_PAGE,
    ...(cursor === undefined ? {} : { cursor }),
  })
  const resources = page.data.flatMap((session) => {
    const name = session.title ?? session.id
    return [
      {
        uri: `${PREFIX}${session.id}/transcript`,
        name: `${session.id}/transcript`,
        title: `Transcript: ${name}`,
        mimeType: 'application/json',
      },
      {
        uri: fileUri(session.id, ''),
        name: `${session.id}/files/`,
        title: `Workspace: ${name}`,
        mimeType: 'application/json',
      },
    ]
  })
  return { resources, ...(page.nextCursor ? { nextCursor: page.nextCursor } : {}) }
}

function decoded(text: string): string {
  try {
    return decodeURIComponent(text)
  } catch {
    throw new CairnProblem('bad_request', 'the resource URI is not valid percent-encoded UTF-8')
  }
}

export async function readResource(
  services: McpServices,
  tenantId: string,
  uri: string,
  signal: AbortSignal,
): Promise<ReadResourceResult> {
  const match = URI.exec(uri)
  const sessionId = match?.[1]
  if (!match || sessionId === undefined)
    throw new CairnProblem(
      'not_found',
      `no resource ${uri}: resources are ${PREFIX}{sessionId}/transcript and ${PREFIX}{sessionId}/files/{path}`,
    )
  const id = decoded(sessionId)
  const asJson = (value: unknown) => ({
    contents: [{ uri, mimeType: 'application/json', text: JSON.stringify(value) }],
  })
  if (match[2] === 'transcript') return asJson({ data: await services.sessions.messages(tenantId, id) })
  const raw = decoded(match[3] ?? '')
  const path = workspaceRelativeBytes(Buffer.from(raw, 'utf8'))
  if (raw === '' || raw.endsWith('/')) {
    const data = await services.workspace.files.listFiles(tenantId, id, path, undefined, { signal })
    return asJson({ data })
  }
  const file = await readWorkspaceFile(services.workspace, tenantId, id, path, undefined, signal)
  const content =
    file.encoding === 'utf8'
      ? { uri, mimeType: 'text/plain', text: file.content }
      : { uri, mimeType: 'application/octet-stream', blob: file.content }
  return { contents: [content] }
}
