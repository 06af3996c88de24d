#!/usr/bin/env bash
# FedRZO's Fig. 3 (NeurIPS 2023, App. D.1): FedRZO_nn (ReLU net, eta = 0.01) against FedAvg,
# FedProx (mu = 0.01), FedMSPP and Scaffnew trained on the softplus net, a panel per (H, beta),
# all compared on the ReLU test loss; experiment `fedrzo_fig3`, `rayfl report` draws fedrzo_fig3.png.
#
#   jobs/fedrzo/fig3.sh                                                   # full MNIST, R = 300
#   jobs/fedrzo/fig3.sh --set data.source=test_only --set run.rounds=100  # offline
set -euo pipefail
cd "$(dirname "$0")/../.."
HS=${HS:-"5 20"}
BETAS=${BETAS:-"1 10 100"}
METHODS=${METHODS:-"fedavg fedprox fedmspp scaffnew"}
SEEDS=${SEEDS:-"0"}
retry() { rayfl run "$@" || rayfl run "$@" --set output.overwrite=true; }  # a timed-out Ray start
for seed in $SEEDS; do
  for h in $HS; do
    echo "== fedrzo_nn H=$h seed=$seed" >&2
    retry jobs/fedrzo/fig1_fedrzo_nn.yaml --quiet --set run.experiment=fedrzo_fig3 --set "run.seed=$seed" \
      --set algorithm.eta=0.01 --set "algorithm.local_steps=$h" --set "run.run_id=fedrzo_nn,H=$h,s$seed" "$@"
    for beta in $BETAS; do
      for method in $METHODS; do
        extra=()
        [ "$method" = fedprox ] && extra=(--set algorithm.mu=0.01)
        echo "== $method H=$h beta=$beta seed=$seed" >&2
        retry jobs/fedrzo/fig3_first_order.yaml --quiet --set "run.seed=$seed" --set "algorithm.name=$method" \
          --set "model.softplus_beta=$beta" --set "algorithm.local_steps=$h" ${extra[@]+"${extra[@]}"} \
          --set "run.run_id=$method,H=$h,beta=$beta,s$seed" "$@"
      done
    done
  done
done
