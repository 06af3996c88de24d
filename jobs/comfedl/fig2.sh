#!/usr/bin/env bash
# ComFedL's Fig. 2 (arXiv 2106.11264, Sec. 5.1): average and worst-client train / validation
# accuracy of ComFedL, DRFL (DRFA), q-FedAvg and FedAvg on the quantity-skewed MNIST, over
# seeds, all under experiment `comfedl_fig2`; `rayfl report <output.dir>/comfedl_fig2` draws it.
#
#   jobs/comfedl/fig2.sh                                                       # 500 rounds, seeds 0 1 2
#   jobs/comfedl/fig2.sh --set data.source=test_only --set run.rounds=300      # offline, real MNIST subset
set -euo pipefail
cd "$(dirname "$0")/../.."
SEEDS=${SEEDS:-"0 1 2"}
METHODS=${METHODS:-"comfedl fedavg drfa qfedavg"}
for seed in $SEEDS; do
  for method in $METHODS; do
    echo "== $method seed=$seed" >&2
    rayfl run "jobs/comfedl/fig2_$method.yaml" --quiet --set "run.seed=$seed" --set "run.run_id=$method-s$seed" "$@"
  done
done
