#!/usr/bin/env bash
# FedRZO's Fig. 3 (NeurIPS 2023, App. D.1): FedRZO_nn (ReLU net, eta = 0.01) against FedAvg,
# FedProx (mu = 0.01), FedMSPP and Scaffnew trained on the softplus net, a panel per (H in HS,
# beta in BETAS), all compared on the ReLU test loss; experiment `fedrzo_fig3`, each run at every
# seed of SEEDS (jobs/grid.sh: run ids fedrzo_nn_H<H>_s<seed>, <method>_H<H>_beta<beta>_s<seed>,
# PARALLEL at a time, DRY_RUN=1 lists them). Extra arguments go to every run.
# Per-method lr (rayfl's protocol: tuned on beta = 10 by jobs/fedrzo/fig3_lr.sh, reused for every
# beta): LR_FEDAVG, LR_FEDPROX, LR_FEDMSPP, LR_SCAFFNEW (unset: the YAML's lr = 0.1). With
# H = 20 in HS, FedMSPP also runs at lr = 0.1 (FEDMSPP_H20_LR) under experiment
# `fedrzo_fig3_fedmspp_h20` (run ids fedmspp_lr0.1_H20_beta<beta>_s<seed>): the lr tuned at H = 5 diverges there.
#   LR_FEDAVG=0.3 LR_FEDPROX=0.3 LR_FEDMSPP=0.3 LR_SCAFFNEW=0.3 SEEDS="0 1 2" PARALLEL=2 \
#     jobs/fedrzo/fig3.sh --set data.source=test_only --set run.rounds=100 --set output.dir=results/fedrzo
#   python scripts/seed_table.py results/fedrzo/fedrzo_fig3 --metric test_loss --final test_accuracy
#   rayfl report results/fedrzo/fedrzo_fig3                     # fedrzo_fig3.png, fedrzo_fig3_final.csv
set -uo pipefail
cd "$(dirname "$0")/../.."
GRID_EXTRA=("$@")
source jobs/grid.sh
HS=${HS:-5 20}
BETAS=${BETAS:-1 10 100}
METHODS=${METHODS:-fedavg fedprox fedmspp scaffnew}
for h in $HS; do
  grid_add "fedrzo_nn_H$h" rayfl run jobs/fedrzo/fig1_fedrzo_nn.yaml --quiet --set run.experiment=fedrzo_fig3 \
    --set algorithm.eta=0.01 --set "algorithm.local_steps=$h"
  for beta in $BETAS; do
    for method in $METHODS; do
      extra=()
      [ "$method" = fedprox ] && extra=(--set algorithm.mu=0.01)
      lr_var="LR_${method^^}"; [ -n "${!lr_var:-}" ] && extra+=(--set "algorithm.lr=${!lr_var}")
      grid_add "${method}_H${h}_beta$beta" rayfl run jobs/fedrzo/fig3_first_order.yaml --quiet \
        --set "algorithm.name=$method" --set "model.softplus_beta=$beta" --set "algorithm.local_steps=$h" \
        ${extra[@]+"${extra[@]}"}
    done
    if [ "$h" = 20 ] && [[ " $METHODS " == *" fedmspp "* ]]; then
      grid_add "fedmspp_lr${FEDMSPP_H20_LR:-0.1}_H20_beta$beta" rayfl run jobs/fedrzo/fig3_first_order.yaml --quiet \
        --set run.experiment=fedrzo_fig3_fedmspp_h20 --set algorithm.name=fedmspp \
        --set "model.softplus_beta=$beta" --set algorithm.local_steps=20 --set "algorithm.lr=${FEDMSPP_H20_LR:-0.1}"
    fi
  done
done
grid_run
