#!/usr/bin/env bash
# FedRZO's Fig. 3 (NeurIPS 2023, App. D.1): FedRZO_nn (ReLU net, eta = 0.01) against FedAvg,
# FedProx (mu = 0.01), FedMSPP and Scaffnew trained on the softplus net, a panel per (H, beta),
# all compared on the ReLU test loss; experiment `fedrzo_fig3`, `rayfl report` draws fedrzo_fig3.png.
#
#   jobs/fedrzo/fig3.sh                                                   # full MNIST, R = 300
#   jobs/fedrzo/fig3.sh --set data.source=test_only --set run.rounds=100  # offline
#
# Per-method lr (rayfl's protocol: tuned on beta = 10, reused for every beta; see
# docs/replications/fedrzo.md, Fig. 3): LR_FEDAVG, LR_FEDPROX,
# LR_FEDMSPP, LR_SCAFFNEW (unset: the YAML's lr = 0.1), e.g.
#   LR_FEDAVG=0.3 LR_FEDPROX=0.3 jobs/fedrzo/fig3.sh --set data.source=test_only
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
        lr_var="LR_${method^^}"; [ -n "${!lr_var:-}" ] && extra+=(--set "algorithm.lr=${!lr_var}")
        echo "== $method H=$h beta=$beta seed=$seed" >&2
        retry jobs/fedrzo/fig3_first_order.yaml --quiet --set "run.seed=$seed" --set "algorithm.name=$method" \
          --set "model.softplus_beta=$beta" --set "algorithm.local_steps=$h" ${extra[@]+"${extra[@]}"} \
          --set "run.run_id=$method,H=$h,beta=$beta,s$seed" "$@"
      done
    done
  done
done
