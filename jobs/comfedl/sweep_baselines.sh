#!/usr/bin/env bash
# The baselines' grids of ComFedL's Sec. 5.3 on the quantity-skewed MNIST, each one
# `rayfl sweep` over lr [0.001 .. 1] x its own parameter x 3 seeds (ComFedL's own grid is
# jobs/comfedl/sweep_grid.yaml):
#   jobs/comfedl/sweep_baselines.sh --set data.source=test_only       # offline
set -euo pipefail
cd "$(dirname "$0")/../.."
LRS="0.001,0.01,0.05,0.1,0.2,0.5,1.0"
rayfl sweep jobs/comfedl/fig2_drfa.yaml --name comfedl_sweep_drfa --grid "algorithm.lr=$LRS" \
  --grid algorithm.weight_lr=0.008,0.08,0.8 --seeds 0,1,2 "$@"
rayfl sweep jobs/comfedl/fig2_qfedavg.yaml --name comfedl_sweep_qfedavg --grid "algorithm.lr=$LRS" \
  --grid algorithm.q=0.1,0.2,0.5,1,2 --seeds 0,1,2 "$@"
rayfl sweep jobs/comfedl/fig2_fedavg.yaml --name comfedl_sweep_fedavg --grid "algorithm.lr=$LRS" --seeds 0,1,2 "$@"
