#!/usr/bin/env bash
# FedRZO's Fig. 1 (NeurIPS 2023, Sec. 5.1): FedRZO_nn on the ReLU network, log of the average
# loss against communication rounds, one panel per eta in {0.1, 0.01, 0.001}, one curve per H in
# {1, 5, 10, 20}; all under experiment `fedrzo_fig1`; `rayfl report <output.dir>/fedrzo_fig1`
# draws it (fedrzo_fig1.png).
#
#   jobs/fedrzo/fig1.sh                                                    # full MNIST, R = 300
#   jobs/fedrzo/fig1.sh --set data.source=test_only --set run.rounds=100   # offline (docs/replications/fedrzo.md's run)
#   SEEDS="0 1 2" jobs/fedrzo/fig1.sh ...                                  # repeats for bands
set -euo pipefail
cd "$(dirname "$0")/../.."
ETAS=${ETAS:-"0.1 0.01 0.001"}
HS=${HS:-"1 5 10 20"}
SEEDS=${SEEDS:-"0"}
for seed in $SEEDS; do
  for eta in $ETAS; do
    for h in $HS; do
      echo "== eta=$eta H=$h seed=$seed" >&2
      args=(jobs/fedrzo/fig1_fedrzo_nn.yaml --quiet --set "run.seed=$seed" --set "algorithm.eta=$eta"
        --set "algorithm.local_steps=$h" --set "run.run_id=eta=$eta,H=$h,s$seed" "$@")
      # a busy machine can time Ray's start out: retry once, replacing the half-made run
      rayfl run "${args[@]}" || rayfl run "${args[@]}" --set output.overwrite=true
    done
  done
done
