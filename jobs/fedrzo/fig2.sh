#!/usr/bin/env bash
# FedRZO's Fig. 2 (NeurIPS 2023): left, federated hyper-parameter learning (fedrzo_bl, Sec. 5.2);
# right, fair classification minimax (fedrzo_minimax, Sec. 5.3); one run per (H, seed), under
# experiments `fedrzo_hyper` and `fedrzo_fair`. `rayfl report <output.dir> --metric implicit_obj` draws both panels
# against upper rounds and against total rounds (lower-level rounds included) and writes the
# delay saving (total rounds to a common loss per H) to fedrzo_fig2_<problem>_saving.csv.
#
#   jobs/fedrzo/fig2.sh                                                  # H in {1, 5, 10, 20}, seeds 0-4
#   HS="1 10" SEEDS=0 jobs/fedrzo/fig2.sh --set data.source=test_only     # offline (docs/replications/fedrzo.md's runs)
set -euo pipefail
cd "$(dirname "$0")/../.."
HS=${HS:-"1 5 10 20"}
SEEDS=${SEEDS:-"0 1 2 3 4"}
PROBLEMS=${PROBLEMS:-"hyper fair"}
for problem in $PROBLEMS; do
  for h in $HS; do
    # the same number of local steps K = R H for every H: R = 600 / H upper rounds (hyper), 1000 / H (fair)
    if [ "$problem" = hyper ]; then rounds=$(( 600 / h )); else rounds=$(( 1000 / h )); fi
    for seed in $SEEDS; do
      echo "== $problem H=$h R=$rounds seed=$seed" >&2
      rayfl run "jobs/fedrzo/${problem}_H10.yaml" --quiet --set "algorithm.local_steps=$h" \
        --set "run.rounds=$rounds" --set "run.seed=$seed" --set "run.run_id=${problem}_H${h}_s${seed}" "$@"
    done
  done
done
