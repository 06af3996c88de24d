#!/usr/bin/env bash
# FedRZO's Fig. 4 (NeurIPS 2023, App. D.2): FedRZO_nn on CIFAR-10 with 4 / 20 / 100 hidden
# neurons, a panel per eta, a line per H, all under experiment `fedrzo_fig4`;
# `rayfl report <output.dir>/fedrzo_fig4` draws it (fedrzo_fig4.png).
#
#   jobs/fedrzo/fig4.sh                                                     # real CIFAR-10, R = 300
#   JOB=jobs/fedrzo/fig4_synthetic.yaml jobs/fedrzo/fig4.sh --set run.rounds=50   # offline, CIFAR-shaped
set -euo pipefail
cd "$(dirname "$0")/../.."
NEURONS=${NEURONS:-"4 20 100"}
ETAS=${ETAS:-"0.1 0.01 0.001"}
HS=${HS:-"1 5 10 20"}
JOB=${JOB:-jobs/fedrzo/fig4_cifar.yaml}
SEEDS=${SEEDS:-"0"}
for seed in $SEEDS; do
  for n1 in $NEURONS; do
    for eta in $ETAS; do
      for h in $HS; do
        echo "== N1=$n1 eta=$eta H=$h seed=$seed" >&2
        args=("$JOB" --quiet --set "run.seed=$seed" --set "model.hidden=[$n1]"
          --set "algorithm.eta=$eta" --set "algorithm.local_steps=$h" --set "run.run_id=N1=$n1,eta=$eta,H=$h,s$seed" "$@")
        rayfl run "${args[@]}" || rayfl run "${args[@]}" --set output.overwrite=true  # retry a timed-out Ray start
      done
    done
  done
done
