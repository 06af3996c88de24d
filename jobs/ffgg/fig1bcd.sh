#!/usr/bin/env bash
# FFGG Fig. 1(b-d): FFGG (GD fine-tuner) vs Local GD, SCAFFOLD, L2GD at tau in TAUS (default
# 100 200 500), 200 rounds (SCAFFOLD and Local GD at tau = 500: 100, their curves do not depend on
# tau); L2GD without the factor M in its step (l2gd_tau100_alpha_noM); FFGG at each tau over 2000
# rounds (ffgg_tau<tau>_long: the floor each tau settles on). Each at every seed of SEEDS (jobs/grid.sh: run ids <method>_tau<tau>_s<seed>,
# PARALLEL at a time, DRY_RUN=1 lists them). Extra arguments go to every run:
#   SEEDS="0 1 2" PARALLEL=2 jobs/ffgg/fig1bcd.sh --set output.dir=results/ffgg
#   python scripts/seed_table.py results/ffgg/ffgg_fig1bcd --at 1 100 200 --final dist_sq --min
set -uo pipefail
cd "$(dirname "$0")/../.."
GRID_EXTRA=("$@")
source jobs/grid.sh
for tau in ${TAUS:-100 200 500}; do
  for m in ffgg local_gd scaffold l2gd; do
    rounds=200
    if [[ $tau == 500 && ( $m == local_gd || $m == scaffold ) ]]; then rounds=100; fi
    grid_add ${m}_tau$tau rayfl run jobs/ffgg/quadratic_fig1bcd_$m.yaml --set algorithm.tau=$tau --set run.rounds=$rounds
  done
done
if [ -z "${TAUS:-}" ]; then
  grid_add l2gd_tau100_alpha_noM rayfl run jobs/ffgg/quadratic_fig1bcd_l2gd.yaml --set algorithm.tau=100 \
    --set run.rounds=200 --set algorithm.alpha_scale=0.03125
fi
for tau in ${TAUS:-100 200 500}; do
  grid_add ffgg_tau${tau}_long rayfl run jobs/ffgg/quadratic_fig1bcd_ffgg.yaml --set algorithm.tau=$tau \
    --set run.rounds=2000 --set run.eval_every=500
done
grid_run
