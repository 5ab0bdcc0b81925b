import { testsRunOnPostgres } from '../helpers/postgres.js'
import { clusterSteps } from './cluster-steps.js'
import { ClusterBed, type ClusterSystem } from './cluster-system.js'
import { faults } from './faults.js'
import { operations } from './operations.js'
import { describeModel } from './runner.js'

/**
 * The model-based fault test on the cluster test bed (docs/architecture.md, "The model-based
 * fault test"): two API replicas, two nodes shipping to a real S3 (Ceph RGW), PostgreSQL; the
 * single server's operations plus move and drain; faults on each part. One bed for all sequences.
 * It runs in the PostgreSQL pass (as the other tests of the cluster bed).
 * CAIRN_CLUSTER_MODEL_BUDGET_MS: wall time for the sequences (20 s, sequences of up to
 * CAIRN_CLUSTER_MODEL_STEPS, 8: CI's share; the bed's start, ~40 s, and the last sequence come on
 * top); `SOAK_BED=cluster npm run soak` runs it for SOAK_MINUTES with sequences of up to 24 steps.
 */
describeModel<ClusterSystem>({
  name: 'cluster model',
  title:
    'operations and faults against API replicas, nodes, PostgreSQL and the object store keep every acknowledged write, strand nothing, answer no 5xx',
  budgetMs: Number(process.env.CAIRN_CLUSTER_MODEL_BUDGET_MS ?? 20_000),
  maxSteps: Number(process.env.CAIRN_CLUSTER_MODEL_STEPS ?? 8),
  // Passed here with the CI budget (and 60 s) at load ~10.
  ciSeed: 652459257,
  choices: true,
  file: 'test/model/cluster.test.ts',
  skip: !testsRunOnPostgres(),
  bed: () => ClusterBed.start(),
  steps: () => [...operations(), ...faults(), ...clusterSteps()],
})
