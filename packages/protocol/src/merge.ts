import { type Static, Type } from '@sinclair/typebox'
import { SessionSchema, SnapshotSchema } from './sessions.js'

/** What the merge does with a file both sides changed in ways that do not merge. */
export const MERGE_STRATEGIES = ['keep', 'markers'] as const
export type MergeStrategy = (typeof MERGE_STRATEGIES)[number]

/**
 * A three-way merge of a fork's changes since its fork point into its parent (or another session
 * of the same agent): base = the snapshot the fork was taken from, theirs = the fork's workspace
 * (or `snapshotId`, one of the fork's snapshots), ours = the target's workspace.
 */
export const MergeBody = Type.Object(
  {
    into: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: 200,
        description: 'the session to merge into (default: the fork’s parent); same agent, same tenant',
      }),
    ),
    snapshotId: Type.Optional(
      Type.String({
        maxLength: 64,
        description: 'merge this snapshot of the fork instead of its live workspace',
      }),
    ),
    preview: Type.Optional(
      Type.Boolean({ default: false, description: 'say what would change; change nothing' }),
    ),
    strategy: Type.Optional(
      Type.Union(
        MERGE_STRATEGIES.map((s) => Type.Literal(s)),
        {
          default: 'keep',
          description:
            'a text file both sides changed on the same lines: keep the target’s version (keep) or write it with conflict markers (markers); other conflicts always keep the target’s version',
        },
      ),
    ),
  },
  { additionalProperties: false },
)
export type MergeBody = Static<typeof MergeBody>

/** One path the merge wrote or deleted in the target. */
export const MergeChangeSchema = Type.Object({
  path: Type.String(),
  action: Type.Union([Type.Literal('add'), Type.Literal('update'), Type.Literal('delete')]),
  /** taken: the fork's version as is; merged: both sides' line changes; markers: with conflict markers. */
  how: Type.Union([Type.Literal('taken'), Type.Literal('merged'), Type.Literal('markers')]),
})
export type MergeChange = Static<typeof MergeChangeSchema>

export const MERGE_CONFLICT_KINDS = ['content', 'delete_modify', 'type', 'unsupported'] as const
export type MergeConflictKind = (typeof MERGE_CONFLICT_KINDS)[number]

/**
 * A path the merge left for the caller. content: both changed it differently (a binary file, or
 * the same lines of a text file); delete_modify: one side deleted what the other changed
 * (`deletedIn` says which); type: a file on one side, a directory or link on another;
 * unsupported: a link, a special file or a name that is not UTF-8, which the merge does not write.
 */
export const MergeConflictSchema = Type.Object({
  path: Type.String(),
  kind: Type.Union(MERGE_CONFLICT_KINDS.map((k) => Type.Literal(k))),
  binary: Type.Boolean(),
  deletedIn: Type.Optional(Type.Union([Type.Literal('fork'), Type.Literal('target')])),
  /** keep: the target's version stays; markers: the file was written with conflict markers. */
  resolution: Type.Union([Type.Literal('keep'), Type.Literal('markers')]),
  reason: Type.String(),
})
export type MergeConflict = Static<typeof MergeConflictSchema>

export const MergeResultSchema = Type.Object({
  preview: Type.Boolean(),
  strategy: Type.Union(MERGE_STRATEGIES.map((s) => Type.Literal(s))),
  fork: Type.Object({
    sessionId: Type.String(),
    /** The fork's snapshot merged, or null: its live workspace (read from a temporary snapshot). */
    snapshotId: Type.Union([Type.String(), Type.Null()]),
  }),
  /** The fork point: the parent's snapshot the fork was taken from. */
  base: Type.Object({ sessionId: Type.String(), snapshotId: Type.String() }),
  into: SessionSchema,
  /** Taken just before the merge (restore it to undo the merge); null for a preview. */
  snapshot: Type.Union([SnapshotSchema, Type.Null()]),
  changes: Type.Array(MergeChangeSchema),
  conflicts: Type.Array(MergeConflictSchema),
})
export type MergeResult = Static<typeof MergeResultSchema>
