#!/usr/bin/env bash
# The lr check behind FedRZO's Fig. 3 grid (rayfl's protocol: tune each first-order method on
# H = 5, beta = 10, reuse the lr for every beta): each method at each lr of LRS (default
# 0.03 0.1 0.3 1.0; FedAvg only at 0.03), experiment `fedrzo_fig3_lrcheck`, each at every seed
# of SEEDS (jobs/grid.sh: run ids <method>_lr<lr>_s<seed>, PARALLEL at a time). Extra arguments
# go to every run:
#   PARALLEL=2 jobs/fedrzo/fig3_lr.sh --set data.source=test_only --set run.rounds=100 --set output.dir=results/fedrzo
#   python scripts/seed_table.py results/fedrzo/fedrzo_fig3_lrcheck --metric test_loss --final test_accuracy
set -uo pipefail
cd "$(dirname "$0")/../.."
GRID_EXTRA=("$@")
source jobs/grid.sh
for method in fedavg fedprox fedmspp scaffnew; do
  for lr in ${LRS:-0.03 0.1 0.3 1.0}; do
    [ "$lr" = 0.03 ] && [ "$method" != fedavg ] && continue
    extra=()
    [ "$method" = fedprox ] && extra=(--set algorithm.mu=0.01)
    grid_add "${method}_lr$lr" rayfl run jobs/fedrzo/fig3_first_order.yaml --quiet \
      --set run.experiment=fedrzo_fig3_lrcheck --set "algorithm.name=$method" --set model.softplus_beta=10 \
      --set algorithm.local_steps=5 --set "algorithm.lr=$lr" ${extra[@]+"${extra[@]}"}
  done
done
grid_run
