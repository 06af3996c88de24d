#!/usr/bin/env bash
# FFGG Fig. 1(a): Alg. 1 with tau CG steps, tau in TAUS (default 1 2 5 10 20 30 40), 2000 rounds,
# and tau = 40 over 4000 rounds (cg_tau40_long), each at every seed of SEEDS (jobs/grid.sh: run ids
# cg_tau<tau>_s<seed>, PARALLEL at a time, DRY_RUN=1 lists them). Extra arguments go to every run:
#   SEEDS="0 1 2" PARALLEL=2 jobs/ffgg/fig1a.sh --set output.dir=results/ffgg
#   python scripts/seed_table.py results/ffgg/ffgg_fig1a --at 500 1000 1500 --final dist_sq --min
set -uo pipefail
cd "$(dirname "$0")/../.."
GRID_EXTRA=("$@")
source jobs/grid.sh
for tau in ${TAUS:-1 2 5 10 20 30 40}; do
  grid_add cg_tau$tau rayfl run jobs/ffgg/quadratic_fig1a.yaml --set algorithm.tau=$tau
done
grid_add cg_tau40_long rayfl run jobs/ffgg/quadratic_fig1a.yaml --set algorithm.tau=40 --set run.rounds=4000
grid_run
