#!/usr/bin/env bash
# ComFedL's Fig. 3 (arXiv 2106.11264, Sec. 5.1): the effect of the synchronization gap tau (top
# row; tau in {1, 2, 5, 10}: not stated in the paper, rayfl's choice) and of gamma (bottom row; {0.1, 0.2, 2, 5}) on ComFedL's
# train and validation accuracy on the quantity-skewed MNIST, everything else as in Fig. 2,
# under experiment `comfedl_fig3`; `rayfl report <output.dir>/comfedl_fig3` draws it.
#
#   jobs/comfedl/fig3.sh                                                     # 500 rounds, seeds 0 1 2
#   SEEDS=0 jobs/comfedl/fig3.sh --set data.source=test_only --set run.rounds=200   # offline
set -uo pipefail
cd "$(dirname "$0")/../.."
SEEDS=${SEEDS:-"0 1 2"}
TAUS=${TAUS:-"1 2 5 10"}
GAMMAS=${GAMMAS:-"0.1 0.2 2 5"}
status=0
for seed in $SEEDS; do
  for tau in $TAUS; do
    echo "== tau=$tau seed=$seed" >&2
    rayfl run jobs/comfedl/fig2_comfedl.yaml --quiet --set run.experiment=comfedl_fig3 --set "run.seed=$seed" \
      --set "run.run_id=tau=$tau,s$seed" --set "algorithm.local_steps=$tau" "$@" || status=1
  done
  for gamma in $GAMMAS; do
    echo "== gamma=$gamma seed=$seed" >&2
    rayfl run jobs/comfedl/fig2_comfedl.yaml --quiet --set run.experiment=comfedl_fig3 --set "run.seed=$seed" \
      --set "run.run_id=gamma=$gamma,s$seed" --set "algorithm.gamma=$gamma" "$@" || status=1
  done
done
exit $status
