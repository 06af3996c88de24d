#!/usr/bin/env bash
# Asynchronous FFGG (Alg. 3), every run of the FFGG page's async table: K = 4 jobs in flight with
# the delay-adaptive step in theory and worker dispatch, on the small instance and on the full-size
# one (10,000 updates), the diverging control (full size, K = 8, constant step 1/L), and every
# client a worker (K = 32, 3,000 updates) in both modes at the K = 4 step and at 1/8 of it.
# Each at every seed of SEEDS (jobs/grid.sh: run ids <run>_s<seed>, PARALLEL at a time, DRY_RUN=1
# lists them). Extra arguments go to every run:
#   SEEDS="0 1 2" PARALLEL=2 jobs/ffgg/async.sh --set output.dir=results/ffgg
#   python scripts/seed_table.py results/ffgg/ffgg_async --at 1 101 501 1001 --final dist_sq
set -uo pipefail
cd "$(dirname "$0")/../.."
GRID_EXTRA=("$@")
source jobs/grid.sh
job=jobs/ffgg/quadratic_async.yaml
full=(--set data.n=10000 --set data.d_theta=100 --set data.d_w=50)
for mode in theory worker; do
  grid_add async_small_k4_$mode rayfl run $job --set algorithm.dispatch=$mode
done
grid_add async_full_k4 rayfl run $job "${full[@]}" --set run.rounds=10000 --set run.eval_every=1000 \
  --set output.checkpoint_every=5000
grid_add async_full_k4_worker rayfl run $job "${full[@]}" --set algorithm.dispatch=worker --set run.rounds=10000 \
  --set run.eval_every=1000 --set output.checkpoint_every=5000
grid_add async_full_k8_constant rayfl run $job "${full[@]}" --set algorithm.concurrency=8 \
  --set algorithm.step_rule=constant --set algorithm.server_lr=null --set run.rounds=1000
for mode in theory worker; do
  grid_add async_small_k32_$mode rayfl run $job --set algorithm.dispatch=$mode --set algorithm.concurrency=32 \
    --set run.rounds=3000
  grid_add async_small_k32_${mode}_lr8 rayfl run $job --set algorithm.dispatch=$mode --set algorithm.concurrency=32 \
    --set run.rounds=3000 --set algorithm.server_lr=0.0015
done
grid_run
