/**
 * `@cairn/runtime/port`: what the server may know of the runtime. The port (`RuntimePort`) and its
 * in-process implementation, and the plain data that crosses it; nothing that hands out a host
 * path, a process or the storage pool.
 */
export type { AgentEvent, AgentLaunch, TurnInput, TurnOutcome } from '../agent/types.js'
export { DEFAULT_LIMITS, DEFAULT_TURN_TIMEOUT_MS } from '../agent/types.js'
export { archiveStream } from '../build/extract-archive.js'
export type { DependencyInstall, RevisionBuild, RevisionBuildResult } from '../build/revision-builder.js'
export type { CommandResult } from '../build/run-command.js'
export {
  canonicalAddress,
  canonicalCidr,
  forbiddenReason,
  hostAddresses,
  inCidrs,
} from '../egress/address-guard.js'
export { bindingAllowed, type EgressPolicy, type EgressRule } from '../egress/policy.js'
export {
  DEFAULT_EGRESS_LIMITS,
  type EgressLimits,
  type EgressRoute,
  type EgressSite,
  type NetworkEvent,
} from '../egress/proxy.js'
export type { ProxySecret } from '../egress/proxy-secrets.js'
export { FORWARDER_PORTS } from '../egress/transparent.js'
export { hostDebianMirror } from '../images/debian-mirror.js'
export type { ImageBuildContext } from '../images/image-builder.js'
export { describeRecipe, HOST_IMAGE, type ImageRecipe, parseImage } from '../images/image-recipe.js'
export type { ImageRecord } from '../images/image-store.js'
export { type DependencyEnv, launchEnvironment } from '../launch/launch-env.js'
export type { IsolationInfo } from '../runtime.js'
export type { IsolationName, SandboxBind, SandboxLimits } from '../sandbox/driver.js'
export type { PoolArea, PoolQuotaStatus, PoolStats, TreeSizes } from '../storage/pool.js'
// One wait for a writable to drain (or never to): the API's streams, a node's turn, a restore's feed.
export { type DrainEnd, type DrainWait, drained } from '../util/drained.js'
// Redaction of secret values: the server's transcripts and logs, and a node's command output.
export {
  MIN_REDACTED_LENGTH,
  RedactingByteStream,
  RedactingStream,
  Redactor,
  secretForms,
} from '../util/redaction.js'
export { BACKGROUND_NICENESS } from '../workspace-io/reader.js'
export { type ConfirmedShip, PortShipping, type PortShippingOptions } from './bucket-shipping.js'
export { LocalRuntimePort, type LocalRuntimePortOptions } from './local-runtime-port.js'
export { type ClusterRole, type ClusterTls, initClusterTls, loadClusterTls } from './remote/cluster-tls.js'
export { RuntimeEventHub } from './remote/event-hub.js'
export { currentOwnerEpoch, type EpochFloor, runWithOwnerEpoch } from './remote/owner-epoch.js'
export { RemoteRuntimePort, type RemoteRuntimePortOptions } from './remote/remote-runtime-port.js'
export {
  type ServedRuntimePort,
  type ServeRuntimePortOptions,
  serveRuntimePort,
} from './remote/serve-runtime-port.js'
export type * from './runtime-port.js'
export type { TurnEnd, TurnMessage } from './turn-stream.js'
export type { PoolClock } from './warm-pool.js'
