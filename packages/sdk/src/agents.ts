import type { AgentDetail, AgentInfo, Artifact, DeployResult, RevisionInfo } from '@cairn/protocol'
import { asAgent, asAgentDetail, asDeployResult, asList, asRevision, checked } from './guards.js'
import type { HttpClient, RequestOptions } from './http.js'
import { readSse } from './sse.js'
import * as valid from './validators.js'

export interface DeployOptions extends RequestOptions {
  /** Overrides the `name` in the archive's cairn.yaml. */
  name?: string | undefined
  /** Answer only once the revision is built (READY or FAILED). */
  wait?: boolean | undefined
}

/** A revision's build log so far. */
export interface BuildLog {
  status: string
  error: string | undefined
  lines: string[]
}

/** What `followLogs` yields: log lines while the revision builds, then its final status. */
export type BuildLogEvent =
  | { type: 'log'; line: string }
  | { type: 'end'; status: string; error: string | undefined }

/** Deploys take longer than ordinary calls (upload, unpack, maybe a build): their default timeout. */
export const DEPLOY_TIMEOUT_MS = 10 * 60 * 1000

const path = (idOrName: string, rest = '') => `/v1/agents/${encodeURIComponent(idOrName)}${rest}`
const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null

export class Agents {
  constructor(private readonly http: HttpClient) {}

  async list(options: RequestOptions = {}): Promise<AgentInfo[]> {
    return asList(
      await this.http.json({ method: 'GET', path: '/v1/agents', ...options }),
      asAgent,
      'agent list',
    )
  }

  /** An agent by ID or name, with its revisions. */
  async get(idOrName: string, options: RequestOptions = {}): Promise<AgentDetail> {
    return asAgentDetail(await this.http.json({ method: 'GET', path: path(idOrName), ...options }))
  }

  async delete(idOrName: string, options: RequestOptions = {}): Promise<void> {
    await this.http.json({ method: 'DELETE', path: path(idOrName), ...options })
  }

  /**
   * Uploads a tar.gz of a project (cairn.yaml at its root) as a new revision. A project with
   * dependencies answers while its revision is still DEPLOYING (unless `wait`); see `followLogs`.
   */
  async deploy(
    archive: Uint8Array | ReadableStream<Uint8Array>,
    options: DeployOptions = {},
  ): Promise<DeployResult> {
    const { name, wait, signal, timeoutMs } = options
    const body = await this.http.json({
      method: 'POST',
      path: '/v1/agents',
      query: { name, wait: wait === undefined ? undefined : String(wait) },
      body: archive,
      contentType: 'application/gzip',
      signal,
      timeoutMs: timeoutMs ?? DEPLOY_TIMEOUT_MS,
    })
    return asDeployResult(body)
  }

  async revision(idOrName: string, revisionId: string, options: RequestOptions = {}): Promise<RevisionInfo> {
    const route = path(idOrName, `/revisions/${encodeURIComponent(revisionId)}`)
    return asRevision(await this.http.json({ method: 'GET', path: route, ...options }))
  }

  /** The agent's artifacts (files promoted out of its sessions' workspaces), oldest first. */
  async artifacts(idOrName: string, options: RequestOptions = {}): Promise<Artifact[]> {
    const body = await this.http.json({ method: 'GET', path: path(idOrName, '/artifacts'), ...options })
    return checked(valid.ArtifactList, body, 'artifact list').data
  }

  /** Deletes an artifact: its bytes leave the tenant's storage quota. Answers what was deleted. */
  async deleteArtifact(
    idOrName: string,
    artifactId: string,
    options: RequestOptions = {},
  ): Promise<Artifact> {
    const route = path(idOrName, `/artifacts/${encodeURIComponent(artifactId)}`)
    return checked(
      valid.Artifact,
      await this.http.json({ method: 'DELETE', path: route, ...options }),
      'artifact',
    )
  }

  /** The build log of a revision, as it stands. */
  async logs(idOrName: string, revisionId: string, options: RequestOptions = {}): Promise<BuildLog> {
    const route = path(idOrName, `/revisions/${encodeURIComponent(revisionId)}/logs`)
    const body = await this.http.json({ method: 'GET', path: route, ...options })
    const { status, error, lines } = checked(valid.BuildLog, body, 'build log')
    return { status, error: error ?? undefined, lines }
  }

  /** The build log line by line while the revision builds, ending with its final status. */
  async *followLogs(
    idOrName: string,
    revisionId: string,
    options: RequestOptions = {},
  ): AsyncGenerator<BuildLogEvent> {
    const { response, done } = await this.http.stream({
      method: 'GET',
      path: path(idOrName, `/revisions/${encodeURIComponent(revisionId)}/logs`),
      query: { follow: 'true' },
      accept: 'text/event-stream',
      ...options,
    })
    try {
      if (!response.body) return
      for await (const message of readSse(response.body)) {
        let data: unknown
        try {
          data = JSON.parse(message.data)
        } catch {
          continue
        }
        if (!isRecord(data)) continue
        if (message.event === 'log' && typeof data.line === 'string') yield { type: 'log', line: data.line }
        if (message.event === 'end') {
          yield {
            type: 'end',
            status: typeof data.status === 'string' ? data.status : 'FAILED',
            error: typeof data.error === 'string' ? data.error : undefined,
          }
          return
        }
      }
    } finally {
      done()
    }
  }
}
