export type {
  AgentDetail,
  AgentInfo,
  CommandInfo,
  CommandSignal,
  DeployResult,
  FileEntry,
  ForksResult,
  MergeChange,
  MergeConflict,
  MergeResult,
  MergeStrategy,
  Message,
  OnTimeoutAction,
  RevisionInfo,
  SandboxDriver,
  SessionInfo,
  SessionPolicy,
  SessionPolicyInput,
  SessionStatus,
  SnapshotInfo,
  StatusEvent,
  StreamEvent,
  ToolCall,
  TreeSizes,
  TurnInfo,
  Usage,
  WorkspaceDiff,
} from '@cairn/protocol'
export { Agents, type BuildLog, type BuildLogEvent, DEPLOY_TIMEOUT_MS, type DeployOptions } from './agents.js'

import { Cairn } from './client.js'

export {
  type AnswerOptions,
  type Approval,
  type ApprovalDecision,
  type ApprovalStatus,
  Approvals,
} from './approvals.js'
export { Cairn, type CairnOptions, DEFAULT_BASE_URL, DEFAULT_TIMEOUT_MS, type RunOptions } from './client.js'
export {
  type CommandOutput,
  type CommandResult,
  Commands,
  type OutputOptions,
  type StartCommandOptions,
} from './commands.js'
export * from './errors.js'
export { decodeEvent } from './events.js'
export type { FetchLike, FetchResponse, RequestOptions } from './http.js'
export { type ImageSummary, Images } from './images.js'
export {
  API_KEY_INFO_FIELDS,
  type ApiKeyInfo,
  type ApiKeyRole,
  type CreateApiKeyOptions,
  type CreatedApiKey,
  Keys,
} from './keys.js'
export { type NodeAction, type NodeState, type NodeSummary, Nodes } from './nodes.js'
export { SECRET_INFO_FIELDS, type SecretInfo, type SecretList, type SecretScope, Secrets } from './secrets.js'
export {
  type CreateSessionOptions,
  type ListSessionsOptions,
  type PreviewUrl,
  type ResumeOptions,
  Session,
  type SessionLease,
  type SessionPage,
  Sessions,
  type StreamOptions,
} from './sessions.js'
export { readSse, type SseMessage, SseParser } from './sse.js'
export {
  AgentStream,
  DEFAULT_MAX_RECONNECTS,
  type FinishReason,
  type OpenedRun,
  type ReconnectInfo,
  type ReconnectOptions,
  type RunResult,
  type StreamDriver,
} from './stream.js'
export {
  type CreatedWebhook,
  type CreateWebhookOptions,
  type ListDeliveriesOptions,
  type UpdateWebhookOptions,
  type WebhookDelivery,
  type WebhookDeliveryStatus,
  type WebhookEventType,
  type WebhookInfo,
  Webhooks,
} from './webhooks.js'
export {
  type FileOptions,
  Files,
  type ImportResult,
  type RestoreResult,
  type SnapshotExtras,
  type SnapshotRef,
  Snapshots,
} from './workspace.js'

/** `import Cairn from '@cairn/sdk'`, as the hosted products' docs import their client. */
export default Cairn
