#!/usr/bin/env bash
# npm run soak: the fault tests for as long as asked (docs/architecture.md, "The model-based fault test").
#   SOAK_MINUTES   how long the model test runs (default 30)
#   SOAK_BED       server (default): the model test on one server, beside the fault loops at their
#                  full counts; cluster: the model test on the cluster test bed alone (it needs
#                  PostgreSQL: it runs as the PostgreSQL pass does)
# A failing sequence of the model test is reported with the seed and path that replay it, and the
# soak goes on (CAIRN_MODEL_KEEP_GOING=1); it fails at the end if any did.
set -euo pipefail
minutes=${SOAK_MINUTES:-30}
budget_ms=$((minutes * 60000))
if [ "${SOAK_BED:-server}" = cluster ]; then
  exec env CAIRN_TEST_DATABASE=postgres CAIRN_CLUSTER_MODEL_BUDGET_MS="$budget_ms" CAIRN_MODEL_KEEP_GOING=1 \
    CAIRN_CLUSTER_MODEL_STEPS="${CAIRN_CLUSTER_MODEL_STEPS:-24}" \
    npx vitest run --config vitest.postgres.config.ts test/model/cluster.test.ts
fi
exec env CAIRN_MODEL_BUDGET_MS="$budget_ms" CAIRN_MODEL_KEEP_GOING=1 CAIRN_FAULT_CYCLES="${CAIRN_FAULT_CYCLES:-1000}" \
  CAIRN_KILL_ROUNDS="${CAIRN_KILL_ROUNDS:-50}" \
  npx vitest run test/model test/faults/cycles.test.ts test/faults/kill9.test.ts
