#!/usr/bin/env bash
# ComFedL's Fig. 5 (arXiv 2106.11264 Sec. 5.2): ComFedL-DAMAML's sensitivity to the
# synchronization gap tau (top row) and to gamma (bottom row), under experiment
# `comfedl_maml_ablation`. The values are not stated in the paper (rayfl's choice): tau in
# {1, 2, 5, 10}, gamma in {0.1, 0.5, 1, 5} (Sec. 5.3's gamma grid). (The five-method
# comparison is Fig. 4: fig4.sh.)
#
#   jobs/comfedl/fig5.sh --set data.dataset=cifar10 --set partition.samples_per_client=5000   # the paper's CIFAR-10
#   jobs/comfedl/fig5.sh --set data.source=test_only                                          # offline, real MNIST subset
set -uo pipefail
cd "$(dirname "$0")/../.."
SEEDS=${SEEDS:-"0 1 2"}
TAUS=${TAUS:-"1 2 5 10"}
GAMMAS=${GAMMAS:-"0.1 0.5 1 5"}
status=0
for seed in $SEEDS; do
  for tau in $TAUS; do
    rayfl run jobs/comfedl/maml_comfedl.yaml --quiet --set run.experiment=comfedl_maml_ablation \
      --set "run.seed=$seed" --set "algorithm.local_steps=$tau" "$@" || status=1
  done
  for gamma in $GAMMAS; do
    rayfl run jobs/comfedl/maml_comfedl.yaml --quiet --set run.experiment=comfedl_maml_ablation \
      --set "run.seed=$seed" --set "algorithm.gamma=$gamma" "$@" || status=1
  done
done
exit $status
