#!/usr/bin/env bash
# ZO-HFL's Table I (arXiv 2504.01839, Sec. IV (ii)): 3 (alpha, beta) settings x 4 methods per
# dataset, tau = 20, R = 500. Each (dataset, setting, method) cell is one `rayfl sweep` over
# SEEDS (Ray Tune trials, MAX_CONCURRENT side by side, resumable: rerun the same command to finish
# an interrupted grid), named zohfl_table1_<dataset>_a<alpha>_b<beta>_<method>.
# `rayfl report <output.dir>` prints the grid (mean ± std over seeds) next to the paper's numbers.
#
#   jobs/zo_hfl/table1.sh                                   # MNIST, Fashion-MNIST, CIFAR-10 (full data)
#   DATASETS=mnist SEEDS="0 1 2" jobs/zo_hfl/table1.sh --set data.source=test_only --set output.dir=/tmp/t1
#   SETTINGS="0.1:0.1" METHODS="zo_hfl fedavg" jobs/zo_hfl/table1.sh --set run.rounds=100
#   SWEEP=0 ...                                             # one plain `rayfl run` at a time instead
#
# Every extra argument goes to each `rayfl sweep` / `rayfl run` (e.g. --set output.dir=/tmp/results);
# a `--set` of the same key later on the line wins, so a tuned setting is one more --set.
# The data is read from data.data_dir ($RAYFL_DATA_DIR when set, else ~/.rayfl/data; downloaded
# there when the network allows).
set -euo pipefail
cd "$(dirname "$0")/../.."
DATASETS=${DATASETS:-"mnist fashion_mnist cifar10"}
SETTINGS=${SETTINGS:-"1000:0.9 1:0.5 0.1:0.1"}   # alpha:beta
METHODS=${METHODS:-"zo_hfl fedavg fedprox scaffold"}
SEEDS=${SEEDS:-"0"}
SWEEP=${SWEEP:-1}
MAX_CONCURRENT=${MAX_CONCURRENT:-2}
SUFFIX=${SUFFIX:-}   # appended to the sweep names, to keep a variant's sweeps apart
for dataset in $DATASETS; do
  for setting in $SETTINGS; do
    alpha=${setting%%:*} beta=${setting##*:}
    for method in $METHODS; do
      cell=(--set "data.dataset=$dataset" --set "partition.alpha=$alpha" --set "algorithm.participation=$beta")
      if [ "$SWEEP" = 1 ]; then
        echo "== $dataset alpha=$alpha beta=$beta $method seeds=$SEEDS" >&2
        rayfl sweep "jobs/zo_hfl/table1_${method}.yaml" --seeds "$(echo $SEEDS | tr ' ' ',')" \
          --name "zohfl_table1_${dataset}_a${alpha}_b${beta}_${method}${SUFFIX}" \
          --max-concurrent "$MAX_CONCURRENT" --set engine.num_hosts=1 "${cell[@]}" "$@"
      else
        for seed in $SEEDS; do
          echo "== $dataset alpha=$alpha beta=$beta $method seed=$seed" >&2
          rayfl run "jobs/zo_hfl/table1_${method}.yaml" --quiet "${cell[@]}" --set "run.seed=$seed" "$@"
        done
      fi
    done
  done
done
