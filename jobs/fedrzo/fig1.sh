#!/usr/bin/env bash
# FedRZO's Fig. 1 (NeurIPS 2023, Sec. 5.1): FedRZO_nn on the ReLU network, log of the average
# loss against communication rounds, one panel per eta in ETAS (default 0.1 0.01 0.001), one
# curve per H in HS (default 1 5 10 20); all under experiment `fedrzo_fig1`, each at every seed
# of SEEDS (jobs/grid.sh: run ids eta<eta>_H<H>_s<seed>, PARALLEL at a time, DRY_RUN=1 lists
# them). Extra arguments go to every run:
#   SEEDS="0 1 2" PARALLEL=2 jobs/fedrzo/fig1.sh --set data.source=test_only --set run.rounds=100 \
#     --set output.dir=results/fedrzo                            # the page's runs (MNIST test set)
#   python scripts/seed_table.py results/fedrzo/fedrzo_fig1 --metric objective --at 25 50 --min \
#     --reach 1.5 --final test_accuracy                         # the page's table
#   rayfl report results/fedrzo/fedrzo_fig1                      # fedrzo_fig1.png, fedrzo_fig1_final.csv
# Without data.source=test_only the runs read full MNIST, R = 300 (the job's).
set -uo pipefail
cd "$(dirname "$0")/../.."
GRID_EXTRA=("$@")
source jobs/grid.sh
for eta in ${ETAS:-0.1 0.01 0.001}; do
  for h in ${HS:-1 5 10 20}; do
    grid_add "eta${eta}_H$h" rayfl run jobs/fedrzo/fig1_fedrzo_nn.yaml --quiet --set "algorithm.eta=$eta" \
      --set "algorithm.local_steps=$h"
  done
done
grid_run
