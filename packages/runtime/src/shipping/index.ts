export { type PutOutcome, ShippingBucket } from './bucket.js'
export { createShippingBucket, type ShippingBucketConfig, shippingBucketFromEnv } from './bucket-config.js'
export {
  type ChainLink,
  ChainLinkV1,
  chainKey,
  parseChainLink,
  parseTreeManifest,
  type TreeKind,
  type TreeManifest,
  TreeManifestV1,
} from './chain-link.js'
export { readChain, readChainHead } from './chain-reader.js'
export { type ExpectedHead, type RestoredWorkspace, restoreFromBucket } from './restore.js'
export {
  type ShippingLag,
  type ShippingObserver,
  WorkspaceShipper,
  type WorkspaceShipperOptions,
} from './workspace-shipper.js'
