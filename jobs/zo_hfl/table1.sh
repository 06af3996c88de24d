#!/usr/bin/env bash
# ZO-HFL's Table I (arXiv 2504.01839, Sec. IV (ii)): 3 (alpha, beta) settings x 4 methods per
# dataset, tau = 20, R = 500, one `rayfl run` at a time, all under experiment `zohfl_table1`.
# `rayfl report <output.dir>/zohfl_table1` prints the grid next to the paper's numbers.
#
#   jobs/zo_hfl/table1.sh                                   # MNIST, Fashion-MNIST, CIFAR-10 (full data)
#   DATASETS=mnist jobs/zo_hfl/table1.sh --set data.source=test_only   # the offline MNIST subset
#   SETTINGS="0.1:0.1" METHODS="zo_hfl fedavg" jobs/zo_hfl/table1.sh --set run.rounds=100
#
# Every extra argument goes to each `rayfl run` (e.g. --set output.dir=/tmp/results).
set -euo pipefail
cd "$(dirname "$0")/.."
DATASETS=${DATASETS:-"mnist fashion_mnist cifar10"}
SETTINGS=${SETTINGS:-"1000:0.9 1:0.5 0.1:0.1"}   # alpha:beta
METHODS=${METHODS:-"zo_hfl fedavg fedprox scaffold"}
SEEDS=${SEEDS:-"0"}
for dataset in $DATASETS; do
  for setting in $SETTINGS; do
    for method in $METHODS; do
      for seed in $SEEDS; do
        echo "== $dataset alpha=${setting%%:*} beta=${setting##*:} $method seed=$seed" >&2
        rayfl run "jobs/zo_hfl/table1_${method}.yaml" --quiet \
          --set "data.dataset=$dataset" --set "partition.alpha=${setting%%:*}" \
          --set "algorithm.participation=${setting##*:}" --set "run.seed=$seed" "$@"
      done
    done
  done
done
