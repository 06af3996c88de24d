#!/usr/bin/env bash
# ComFedL's Fig. 4 (arXiv 2106.11264 Sec. 5.2): the MAML comparison. All five methods, each
# from its own job (jobs/comfedl/maml_*.yaml), over seeds, under experiment `comfedl_maml`:
# ComFedL-DAMAML, FedMAML (Per-FedAvg), TR-MAML, Ditto and FedAvg with the one-step adaptation.
# Every method's validation accuracy is measured after one SGD step on the client's own data
# (Ditto: its personal model); `rayfl report <output.dir>` draws the figure
# (rayfl/papers/comfedl/maml_report.py).
#
#   jobs/comfedl/fig4.sh --set data.dataset=cifar10 --set partition.samples_per_client=5000   # the paper's CIFAR-10
#   jobs/comfedl/fig4.sh --set data.source=test_only                                          # offline, real MNIST subset
#   SEEDS=0 METHODS="per_fedavg ditto" jobs/comfedl/fig4.sh --set data.source=test_only --set run.rounds=20
#
# Extra arguments go to every `rayfl run`. A failed run is reported and the grid goes on.
set -uo pipefail
cd "$(dirname "$0")/../.."
METHODS=${METHODS:-"comfedl per_fedavg tr_maml ditto fedavg"}
SEEDS=${SEEDS:-"0 1 2"}
status=0
for seed in $SEEDS; do
  for method in $METHODS; do
    echo "== $method seed=$seed" >&2
    # a Ray start that times out on a busy machine is retried once
    rayfl run "jobs/comfedl/maml_$method.yaml" --quiet --set "run.seed=$seed" "$@" \
      || rayfl run "jobs/comfedl/maml_$method.yaml" --quiet --set "run.seed=$seed" "$@" \
      || { echo "!! $method seed=$seed failed" >&2; status=1; }
  done
done
exit $status
