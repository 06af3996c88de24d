#!/usr/bin/env bash
# FedRZO's Fig. 2 (NeurIPS 2023): left, federated hyper-parameter learning (fedrzo_bl, Sec. 5.2,
# experiment `fedrzo_hyper`); right, fair classification minimax (fedrzo_minimax, Sec. 5.3,
# `fedrzo_fair`). PROBLEMS (default hyper fair) x HS (default 1 10), each at every seed of SEEDS
# (jobs/grid.sh: run ids <problem>_H<H>_s<seed>, PARALLEL at a time, DRY_RUN=1 lists them).
# H = 1 and 10 run jobs/fedrzo/<problem>_H<H>.yaml as it stands (hyper: 150 / 60 upper rounds;
# fair: 100 / 100); any other H runs the H = 10 job with that H and the local-step budget of
# the H = 10 job, K = R H = 600 (hyper) / 1000 (fair), so R = K / H.
#   SEEDS="0 1 2" PARALLEL=2 jobs/fedrzo/fig2.sh --set data.source=test_only \
#     --set output.dir=results/fedrzo                           # the page's runs (MNIST test set)
#   rayfl report results/fedrzo --metric implicit_obj            # both panels, the delay saving
#   python scripts/seed_table.py results/fedrzo/fedrzo_hyper --metric implicit_obj \
#     --final total_rounds lower_bytes_cum                      # the page's table (fair: fedrzo_fair)
set -uo pipefail
cd "$(dirname "$0")/../.."
GRID_EXTRA=("$@")
source jobs/grid.sh
for problem in ${PROBLEMS:-hyper fair}; do
  for h in ${HS:-1 10}; do
    job=jobs/fedrzo/${problem}_H$h.yaml
    if [ -f "$job" ]; then
      grid_add "${problem}_H$h" rayfl run "$job" --quiet
    else
      if [ "$problem" = hyper ]; then budget=600; else budget=1000; fi
      grid_add "${problem}_H$h" rayfl run "jobs/fedrzo/${problem}_H10.yaml" --quiet \
        --set "algorithm.local_steps=$h" --set "run.rounds=$(( budget / h ))"
    fi
  done
done
grid_run
