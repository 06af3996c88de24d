#!/usr/bin/env bash
# ZO-HFL's Fig. 2 (arXiv 2504.01839, Sec. IV (i)): the global loss f1 + penalty against the
# round for tau in {5, 20, 50}, per (alpha, beta) setting, on Fashion-MNIST and CIFAR-10, all
# under experiment `zohfl_fig2`; `rayfl report <output.dir>/zohfl_fig2` draws it.
#
#   jobs/zo_hfl/fig2.sh                                          # R = 500 (the paper's R is unstated)
#   DATASETS=mnist jobs/zo_hfl/fig2.sh --set data.source=test_only --set run.rounds=100   # offline
set -euo pipefail
cd "$(dirname "$0")/../.."
DATASETS=${DATASETS:-"fashion_mnist cifar10"}
SETTINGS=${SETTINGS:-"1000:0.9 1:0.5 0.1:0.1"}
TAUS=${TAUS:-"5 20 50"}
for dataset in $DATASETS; do
  for setting in $SETTINGS; do
    for tau in $TAUS; do
      echo "== $dataset alpha=${setting%%:*} beta=${setting##*:} tau=$tau" >&2
      rayfl run jobs/zo_hfl/table1_zo_hfl.yaml --quiet --set run.experiment=zohfl_fig2 --set run.eval_every=5 \
        --set "data.dataset=$dataset" --set "partition.alpha=${setting%%:*}" \
        --set "algorithm.participation=${setting##*:}" --set "algorithm.local_schedule.tau=$tau" "$@"
    done
  done
done
