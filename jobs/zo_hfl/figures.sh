#!/usr/bin/env bash
# ZO-HFL's Fig. 1 (the Dirichlet partition of MNIST over m = 10 clients, for alpha in
# {1000, 1, 0.1}) and Fig. 3 (the appendix toy implicit function, with a ZO-HFL run on it).
#
#   jobs/zo_hfl/figures.sh figures/                              # full MNIST
#   jobs/zo_hfl/figures.sh figures/ --set data.source=test_only  # the offline subset
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-figures}
shift || true
mkdir -p "$OUT"
for alpha in 1000 1 0.1; do
  rayfl partition jobs/zo_hfl/table1_zo_hfl.yaml --set "partition.alpha=$alpha" --plot "$OUT/zohfl_fig1_alpha$alpha.png" "$@"
done
python -m rayfl.papers.zo_hfl.toy --plot "$OUT/zohfl_fig3_toy.png"
