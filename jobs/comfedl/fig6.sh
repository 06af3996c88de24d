#!/usr/bin/env bash
# ComFedL's Fig. 6 (arXiv 2106.11264, Sec. 5.2): ComFedL-DAMAML against FedAvg (both evaluated
# after one adaptation step) as the dominant-class fraction rho grows (rho = 0.1 is IID;
# {0.1, 0.28, 0.5, 0.7, 0.9}: not stated in the paper, rayfl's choice), under experiment
# `comfedl_fig6`, from the MAML comparison's jobs (jobs/comfedl/maml_comfedl.yaml,
# maml_fedavg.yaml: the Conv-4 on the dominant-class split); `rayfl report
# <output.dir>/comfedl_fig6` draws it.
#
#   jobs/comfedl/fig6.sh --set data.dataset=cifar10 --set partition.samples_per_client=5000   # the paper's CIFAR-10
#   SEEDS=0 jobs/comfedl/fig6.sh --set data.source=test_only --set run.rounds=50            # offline, real MNIST subset
set -uo pipefail
cd "$(dirname "$0")/../.."
SEEDS=${SEEDS:-"0 1 2"}
RHOS=${RHOS:-"0.1 0.28 0.5 0.7 0.9"}
METHODS=${METHODS:-"comfedl fedavg"}
status=0
for seed in $SEEDS; do
  for rho in $RHOS; do
    for method in $METHODS; do
      echo "== $method rho=$rho seed=$seed" >&2
      rayfl run "jobs/comfedl/maml_$method.yaml" --quiet --set run.experiment=comfedl_fig6 --set "run.seed=$seed" \
        --set "run.run_id=$method,rho=$rho,s$seed" --set "partition.rho=$rho" "$@" || status=1
    done
  done
done
exit $status
