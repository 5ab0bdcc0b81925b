export { AgentProcess } from './agent/agent-process.js'
export { MARK_END, MARK_START, StdioMarkerParser } from './agent/stdio-marker.js'
export {
  type AgentEvent,
  type AgentLaunch,
  DEFAULT_LIMITS,
  DEFAULT_TURN_TIMEOUT_MS,
  type TurnInput,
  type TurnOutcome,
} from './agent/types.js'
export { archiveStream, extractArchive } from './build/extract-archive.js'
export { type DependencyInstall, type RevisionBuild, RevisionBuilder } from './build/revision-builder.js'
export { type CommandResult, type CommandSpec, runSandboxedCommand } from './build/run-command.js'
export {
  type CheckpointManifest,
  MemoryCheckpoints,
  type ResumedStart,
  type Resumption,
  startFromCheckpoint,
} from './checkpoint/memory-checkpoints.js'
export { forbiddenReason } from './egress/address-guard.js'
export { EgressCa } from './egress/egress-ca.js'
export { bindingAllowed, decide, type EgressPolicy, type EgressRule } from './egress/policy.js'
export {
  DEFAULT_EGRESS_LIMITS,
  type EgressLimits,
  EgressProxy,
  type EgressRoute,
  type EgressSite,
  type NetworkEvent,
} from './egress/proxy.js'
export { type ProxySecret, secretsBoundTo, swapInSecrets, swapOutSecrets } from './egress/proxy-secrets.js'
export { hostDebianMirror } from './images/debian-mirror.js'
export { type ImageBuildContext, ImageBuilder } from './images/image-builder.js'
export { describeRecipe, HOST_IMAGE, type ImageRecipe, parseImage } from './images/image-recipe.js'
export { type ImageRecord, ImageStore } from './images/image-store.js'
export { treeBytes } from './images/pull-bounds.js'
export {
  type DependencyEnv,
  ENV_VARIABLES,
  envBinds,
  launchEnvironment,
} from './launch/launch-env.js'
export { AGENT_KIT_DIR, instanceRunDir } from './paths.js'
export {
  DEFAULT_POOL_IMAGE_BYTES,
  DEFAULT_SANDBOX_UID,
  type IsolationInfo,
  Runtime,
  type RuntimeOptions,
} from './runtime.js'
export { BwrapDriver } from './sandbox/bwrap-driver.js'
export { requireCapability } from './sandbox/capabilities.js'
export { CgroupManager } from './sandbox/cgroups.js'
export {
  type DriverCapabilities,
  ISOLATIONS,
  type IsolationName,
  isIsolationName,
  type Sandbox,
  type SandboxBind,
  type SandboxDriver,
  type SandboxExit,
  type SandboxLimits,
  type SandboxSpec,
} from './sandbox/driver.js'
export {
  type GvisorAvailability,
  GvisorDriver,
  type GvisorDriverOptions,
  probeGvisor,
} from './sandbox/gvisor-driver.js'
export { OverlayMounter } from './sandbox/overlay-mounter.js'
export {
  type ChainLink,
  createShippingBucket,
  type RestoredWorkspace,
  readChain,
  readChainHead,
  restoreFromBucket,
  ShippingBucket,
  type ShippingBucketConfig,
  type ShippingLag,
  type ShippingObserver,
  shippingBucketFromEnv,
  WorkspaceShipper,
  type WorkspaceShipperOptions,
} from './shipping/index.js'
export { BtrfsPool, defaultReserveBytes, tenantQgroup } from './storage/btrfs-pool.js'
export { DirPool } from './storage/dir-pool.js'
export { EnvStore } from './storage/env-store.js'
export {
  isStorageDriver,
  POOL_AREAS,
  type PoolArea,
  type PoolQuotaStatus,
  type PoolQuotas,
  type PoolStats,
  STORAGE_DRIVERS,
  type StorageDriverName,
  type StoragePool,
  type TreeSizes,
} from './storage/pool.js'
export { execTool } from './util/exec.js'
export { type Logger, noopLogger } from './util/logger.js'
export { findMount, readMounts } from './util/mounts.js'
