import { faults } from './faults.js'
import { operations } from './operations.js'
import { describeModel } from './runner.js'
import { type SingleServer, SingleServerBed, serverFaults } from './single-server.js'

/**
 * The model-based fault test on one `cairn server` (docs/architecture.md, "The model-based fault
 * test"): a fresh server and data dir for each sequence. CAIRN_MODEL_BUDGET_MS: wall time for all
 * sequences (150 s; the PostgreSQL pass gives it 90 s); replay as test/model/runner.ts says.
 */
describeModel<SingleServer>({
  name: 'model',
  title:
    'operations and faults against a real server keep every acknowledged write, strand nothing, answer no 5xx',
  budgetMs: Number(process.env.CAIRN_MODEL_BUDGET_MS ?? 150_000),
  maxSteps: 24,
  // Passed here 47 sequences in 15 min at load 15.
  ciSeed: 650280898,
  file: 'test/model/model.test.ts',
  bed: async () => new SingleServerBed(),
  steps: () => [...operations(), ...faults(), ...serverFaults()],
})
