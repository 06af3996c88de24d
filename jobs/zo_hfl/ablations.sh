#!/usr/bin/env bash
# The confounder checks of ZO-HFL's Table I (docs/replications/zo-hfl.md, Confounder ablations):
# the server's own gradient step on its 30% of the data (Alg. 1 line 7, Sec. IV), which the paper
# does not give the baselines, and ZO-HFL's two solves per round; per (alpha, beta) setting,
# under experiment `zohfl_ablations` (`rayfl report` lists them under the Table I grid):
#   zo_hfl lam=0            server-only SGD on f1: what the server's 30% alone gives
#   fedavg/scaffold +server the baselines with the server's data as an always-on client
#   fedavg 2H               the baseline with ZO-HFL's compute (two solves of H each)
#   zo_hfl independent      independent minibatches for the +- solves (no common random numbers)
#
#   SETTINGS="0.1:0.1" jobs/zo_hfl/ablations.sh --set data.source=test_only
set -euo pipefail
cd "$(dirname "$0")/../.."
DATASET=${DATASET:-mnist}
SETTINGS=${SETTINGS:-"0.1:0.1 1:0.5 1000:0.9"}
ABLATIONS=${ABLATIONS:-"zo_hfl:algorithm.lam=0 fedavg:algorithm.server_as_client=true scaffold:algorithm.server_as_client=true fedavg:algorithm.local_schedule.multiplier=2 zo_hfl:algorithm.randomness=independent"}
for setting in $SETTINGS; do
  for ablation in $ABLATIONS; do
    method=${ablation%%:*}
    echo "== $DATASET alpha=${setting%%:*} beta=${setting##*:} $method ${ablation#*:}" >&2
    rayfl run "jobs/zo_hfl/table1_${method}.yaml" --quiet --set run.experiment=zohfl_ablations \
      --set "data.dataset=$DATASET" --set "partition.alpha=${setting%%:*}" \
      --set "algorithm.participation=${setting##*:}" --set "${ablation#*:}" "$@"
  done
done
