#!/usr/bin/env bash
# FFGG's Table 1 (arXiv 2305.18285, §3.3): per dataset, (1) FedAvg, (2) Local FFGG with
# input / output / adapter personalization, (3) 5 epochs of local fine-tuning of w, plus the
# FedAvg and FedAvg + fine-tuning baselines; each stage starts from the previous one's model.
# rayfl.papers.ffgg.pipeline runs the grid (completed runs are skipped: re-run to continue);
# `rayfl report <out>/ffgg_table1_<dataset>` lays out Table 1 next to the paper's numbers.
#
#   jobs/ffgg/table1.sh                                   # offline: real MNIST subset, 3 seeds
#   DATASETS="emnist gldv2 stackoverflow" jobs/ffgg/table1.sh --set data.data_dir=/data   # GPU cluster
#   SEEDS=0 SCHEMES=adapter OUT=/tmp/ffgg jobs/ffgg/table1.sh --set run.rounds=5
#
# Every extra argument goes to every stage's run (e.g. --set engine.num_hosts=2).
set -euo pipefail
cd "$(dirname "$0")/../.."
DATASETS=${DATASETS:-"mnist"}
SCHEMES=${SCHEMES:-"input,output,adapter"}
SEEDS=${SEEDS:-"0,1,2"}
OUT=${OUT:-results}
for dataset in $DATASETS; do
  echo "== FFGG Table 1: $dataset (schemes $SCHEMES, seeds $SEEDS) -> $OUT/ffgg_table1_$dataset" >&2
  extra=()
  for arg in "$@"; do
    if [[ "$arg" == "--set" ]]; then continue; fi
    extra+=(--set "$arg")
  done
  python -m rayfl.papers.ffgg.pipeline --dataset "$dataset" --schemes "$SCHEMES" --seeds "$SEEDS" --out "$OUT" "${extra[@]}"
done
