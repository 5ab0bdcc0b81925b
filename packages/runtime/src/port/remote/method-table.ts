import { type TSchema, Type } from '@sinclair/typebox'
import type { RuntimePort, TreeRef as TreeRefValue } from '../runtime-port.js'
import * as S from './schemas.js'

/**
 * How one argument of a port method crosses the network: plain data (`json`, checked against its
 * schema at the node), or what a remote call carries another way: a per-call callback's lines as
 * frames of the answer (`lines`, an image build's `context`), an abort signal as the call's
 * stream being reset (`signal`, a read's `readOptions`), a byte stream as the request body.
 */
export type ArgKind =
  | { kind: 'json'; schema: TSchema; optional?: true }
  | { kind: 'lines' }
  | { kind: 'context' }
  | { kind: 'readOptions' }
  | { kind: 'signal' }
  | { kind: 'body' }

/**
 * How the answer crosses: a JSON result frame (after any log frames); a turn's messages as
 * frames (`turn`); a byte stream (`file`: with its size; `export`: stopped by resetting it;
 * `stream`: a bare Readable); a
 * bidirectional byte stream (`duplex`); an admission, whose release is a call of its own.
 */
export type ResultKind = 'json' | 'turn' | 'file' | 'export' | 'stream' | 'duplex' | 'admission'

export interface MethodSpec {
  args: readonly ArgKind[]
  result: ResultKind
  /** The session the call acts for: the node checks its owner epoch (see `EpochFence`). */
  session?: (args: readonly unknown[]) => string | undefined
}

const json = (schema: TSchema): ArgKind => ({ kind: 'json', schema })
const maybe = (schema: TSchema): ArgKind => ({ kind: 'json', schema, optional: true })
const id = json(S.Id)
const count = json(Type.Integer({ minimum: 0 }))
const text = json(Type.String())
const ids = json(Type.Array(S.Id))
const tree = json(S.TreeRef)
const bytes = json(Type.Uint8Array())
const readOptions: ArgKind = { kind: 'readOptions' }
const context: ArgKind = { kind: 'context' }

const first = (args: readonly unknown[]) => args[0] as string
const second = (args: readonly unknown[]) => args[1] as string
const field = (key: string) => (args: readonly unknown[]) => (args[0] as Record<string, string>)[key]
const treeSession = (args: readonly unknown[]) => {
  const ref = args[0] as TreeRefValue
  return 'sessionId' in ref ? ref.sessionId : undefined
}

/** Every method of `RuntimePort` (the compiler refuses one missing), and how it crosses. */
export const METHODS: Record<keyof RuntimePort, MethodSpec> = {
  // agents
  admitAgent: { args: [json(S.Admission)], result: 'admission', session: field('sessionId') },
  resumeAgent: { args: [id], result: 'json', session: first },
  startAgent: { args: [json(S.AgentSpec)], result: 'json', session: field('sessionId') },
  agent: { args: [id], result: 'json', session: first },
  runTurn: { args: [id, json(S.TurnInput), maybe(S.TurnOptions)], result: 'turn', session: first },
  cancelTurn: { args: [id, id], result: 'json', session: first },
  coolDown: { args: [id, count], result: 'json', session: first },
  keepWarm: { args: [id, count, maybe(Type.Boolean())], result: 'json', session: first },
  stopAgent: { args: [id], result: 'json', session: first },
  stopAllAgents: { args: [], result: 'json' },
  warmCount: { args: [], result: 'json' },
  listeningPorts: { args: [id], result: 'json', session: first },
  connectPort: {
    args: [id, json(Type.Integer({ minimum: 1, maximum: 65535 }))],
    result: 'duplex',
    session: first,
  },
  // workspaces and snapshots
  createWorkspace: { args: [id, id, id], result: 'json', session: first },
  hasWorkspace: { args: [id], result: 'json', session: first },
  deleteWorkspace: { args: [id], result: 'json', session: first },
  snapshotWorkspace: { args: [id, id, id, maybe(S.SnapshotOptions)], result: 'json', session: first },
  unchangedSince: { args: [id, json(S.WorkspaceMark)], result: 'json', session: first },
  restoreWorkspace: { args: [id, id, count, id], result: 'json', session: first },
  forkWorkspace: { args: [id, id, id], result: 'json', session: first },
  deleteSnapshot: { args: [id], result: 'json' },
  hasSnapshot: { args: [id], result: 'json' },
  readGenerations: { args: [ids], result: 'json' },
  writeGeneration: { args: [id, count], result: 'json', session: first },
  poolStats: { args: [], result: 'json' },
  quotaStatus: { args: [], result: 'json' },
  tenantUsage: { args: [ids], result: 'json' },
  sandboxDriver: { args: [maybe(S.IsolationName)], result: 'json' },
  describe: { args: [], result: 'json' },
  listStored: { args: [json(S.PoolArea)], result: 'json' },
  recoverWorkspace: { args: [id], result: 'json', session: first },
  discardStaging: { args: [id], result: 'json' },
  // reading trees
  hasTree: { args: [tree], result: 'json', session: treeSession },
  hasPath: { args: [tree, json(S.RelPath)], result: 'json', session: treeSession },
  listFiles: { args: [tree, bytes, readOptions], result: 'json', session: treeSession },
  openFile: { args: [tree, bytes, readOptions], result: 'file', session: treeSession },
  diff: { args: [tree, tree, text, readOptions], result: 'json' },
  digest: { args: [tree, readOptions], result: 'json', session: treeSession },
  treeSizes: { args: [tree], result: 'json', session: treeSession },
  memoryCheckpointBytes: { args: [ids], result: 'json' },
  checkpointForSnapshot: { args: [id, id], result: 'json', session: first },
  checkpointForFork: { args: [id], result: 'json', session: first },
  keepSnapshotMemory: { args: [id, id, id], result: 'json', session: first },
  exportMemory: { args: [id], result: 'export', session: first },
  importMemory: { args: [id, bytes, count], result: 'json', session: first },
  forkMemory: { args: [id, id, count], result: 'json', session: second },
  expireMemoryCheckpoints: { args: [json(Type.Date())], result: 'json' },
  exportTree: { args: [tree], result: 'export', session: treeSession },
  // commands in a workspace
  writeFile: { args: [id, text, { kind: 'body' }], result: 'json', session: first },
  deletePath: { args: [id, text], result: 'json', session: first },
  replaceWorkspaceWithArchive: { args: [id, id, bytes, count], result: 'json', session: first },
  unpackIntoWorkspace: { args: [id, bytes], result: 'json', session: first },
  runCommand: {
    args: [json(S.WorkspaceCommand), { kind: 'lines' }, { kind: 'signal' }],
    result: 'json',
    session: field('sessionId'),
  },
  // commands beside the agent
  startCommand: { args: [json(S.CommandStart)], result: 'json', session: field('sessionId') },
  readCommand: { args: [json(S.CommandReadRequest)], result: 'json', session: field('sessionId') },
  writeCommandInput: { args: [id, id, bytes, json(Type.Boolean())], result: 'json', session: first },
  signalCommand: { args: [id, id, json(S.CommandSignal)], result: 'json', session: first },
  resizeCommand: { args: [id, id, json(S.TerminalSize)], result: 'json', session: first },
  // revisions
  stageRevision: { args: [id, id, bytes], result: 'json' },
  buildRevision: { args: [json(S.RevisionBuild), { kind: 'lines' }], result: 'json' },
  sealRevision: { args: [id, id], result: 'json' },
  discardStagedRevision: { args: [id], result: 'json' },
  exportPoolTree: { args: [json(S.ShippedTree)], result: 'stream' },
  importPoolTree: { args: [json(S.ShippedTree), id, { kind: 'body' }], result: 'json' },
  // the shipping bucket
  restoreFromBucket: { args: [id, id, json(S.ShippedHead)], result: 'json', session: first },
  shipPoolTree: { args: [json(S.ShippedTree)], result: 'json' },
  fetchPoolTree: { args: [json(S.ShippedTree), id], result: 'json' },
  shippingLag: { args: [], result: 'json' },
  // images
  imageKeyOf: { args: [json(S.ImageRecipe), context], result: 'json' },
  hasImage: { args: [json(S.Key)], result: 'json' },
  ensureImage: { args: [json(S.ImageRecipe), json(S.Key), context], result: 'json' },
  image: { args: [json(S.Key)], result: 'json' },
  listImages: { args: [], result: 'json' },
  removeImage: { args: [json(S.Key)], result: 'json' },
  // agent memory
  publishMemory: { args: [id, count, text], result: 'json' },
}

/** The wire's own call besides the port's: releasing an admission (`admitAgent`'s answer). */
export const RELEASE_ADMISSION = 'releaseAdmission'

/** The JSON each argument kind sends (`lines`, `signal` and `body` send nothing: null). */
export function wireSchema(spec: MethodSpec): TSchema {
  return Type.Tuple(
    spec.args.map((arg) => {
      switch (arg.kind) {
        case 'json':
          return arg.optional ? Type.Union([arg.schema, Type.Null()]) : arg.schema
        case 'context':
          return S.BuildContext
        case 'readOptions':
          return Type.Union([S.ReadOptions, Type.Null()])
        default:
          return Type.Null()
      }
    }),
  )
}
