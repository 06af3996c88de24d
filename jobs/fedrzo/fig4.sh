#!/usr/bin/env bash
# FedRZO's Fig. 4 (NeurIPS 2023, App. D.2): FedRZO_nn on CIFAR-10 with NEURONS (default 4 20 100)
# hidden neurons, a panel per eta in ETAS, a line per H in HS, all under experiment `fedrzo_fig4`,
# each at every seed of SEEDS (jobs/grid.sh: run ids N<n1>_eta<eta>_H<H>_s<seed>, PARALLEL at a
# time, DRY_RUN=1 lists them). JOB picks the job (default jobs/fedrzo/fig4_cifar.yaml, real
# CIFAR-10, R = 300); extra arguments go to every run:
#   JOB=jobs/fedrzo/fig4_synthetic.yaml SEEDS="0 1 2" PARALLEL=2 jobs/fedrzo/fig4.sh \
#     --set run.rounds=30 --set run.eval_every=5 --set output.dir=results/fedrzo   # offline, CIFAR-shaped
#   python scripts/seed_table.py results/fedrzo/fedrzo_fig4 --metric objective --at 5 --final test_accuracy
#   rayfl report results/fedrzo/fedrzo_fig4                     # fedrzo_fig4.png, fedrzo_fig4_final.csv
set -uo pipefail
cd "$(dirname "$0")/../.."
GRID_EXTRA=("$@")
source jobs/grid.sh
JOB=${JOB:-jobs/fedrzo/fig4_cifar.yaml}
for n1 in ${NEURONS:-4 20 100}; do
  for eta in ${ETAS:-0.1 0.01 0.001}; do
    for h in ${HS:-1 5 10 20}; do
      grid_add "N${n1}_eta${eta}_H$h" rayfl run "$JOB" --quiet --set "model.hidden=[$n1]" \
        --set "algorithm.eta=$eta" --set "algorithm.local_steps=$h"
    done
  done
done
grid_run
