#!/usr/bin/env bash
# The confounder checks of ZO-HFL's Table I (docs/replications/zo-hfl.md, Confounder ablations):
# the server's own gradient step on its 30% of the data (Alg. 1 line 7, Sec. IV), which the paper
# does not give the baselines, and ZO-HFL's two solves per round; per (alpha, beta) setting of
# SETTINGS, under experiment `zohfl_ablations` (`rayfl report` lists them under the Table I grid):
#   zo_hfl lam=0            server-only SGD on f1: what the server's 30% alone gives
#   fedavg/scaffold +server the baselines with the server's data as an always-on client
#   fedavg 2H               the baseline with ZO-HFL's compute (two solves of H each)
#   zo_hfl independent      independent minibatches for the +- solves (no common random numbers)
# Each at every seed of SEEDS (jobs/grid.sh: run ids a<alpha>_b<beta>_<method>_<change>_s<seed>,
# PARALLEL at a time, DRY_RUN=1 lists them); extra arguments go to every run:
#   SETTINGS="0.1:0.1" SEEDS="0 1 2" PARALLEL=2 jobs/zo_hfl/ablations.sh --set data.source=test_only \
#     --set engine.vectorize=on --set engine.num_hosts=1 --set output.dir=results/zo_hfl/ablations
#   rayfl report results/zo_hfl/ablations   # zohfl_table1.md: one row per ablation
set -uo pipefail
cd "$(dirname "$0")/../.."
GRID_EXTRA=("$@")
source jobs/grid.sh
DATASET=${DATASET:-mnist}
ABLATIONS=${ABLATIONS:-"zo_hfl:algorithm.lam=0 fedavg:algorithm.server_as_client=true scaffold:algorithm.server_as_client=true fedavg:algorithm.local_schedule.multiplier=2 zo_hfl:algorithm.randomness=independent"}
for setting in ${SETTINGS:-0.1:0.1 1:0.5 1000:0.9}; do
  alpha=${setting%%:*} beta=${setting##*:}
  for ablation in $ABLATIONS; do
    method=${ablation%%:*} change=${ablation#*:}
    tag=${change##*.}
    grid_add "a${alpha}_b${beta}_${method}_${tag//=/}" rayfl run "jobs/zo_hfl/table1_${method}.yaml" --quiet \
      --set run.experiment=zohfl_ablations --set "data.dataset=$DATASET" --set "partition.alpha=$alpha" \
      --set "algorithm.participation=$beta" --set "$change"
  done
done
grid_run
