#!/usr/bin/env bash
# The BR-FFGG table of docs/replications/ffgg.md, every row: 10% Byzantine clients (3 of 32)
# against bucketing(2) + coordinate-wise median (BR-FFGG) and against the plain mean.
#   - sign flip scaled by 20, and unscaled (an unscaled flip by 3 of 32 clients only shrinks the
#     mean to 26/32 of the honest one, so plain averaging still converges: the scaled flip is the
#     attack that breaks it);
#   - ALIE with Baruch's z_max (0.157 for n = 32, f = 3), and with z = 10;
#   - Gaussian noise with sigma 1 (also against trimmed mean, Krum, geometric median and centered
#     clipping, without bucketing) and sigma 10;
#   - the attack-free control (plain mean).
# The plain mean is FFGG itself (`ffgg`, full participation as in the job) under the same
# attack: br_ffgg refuses a non-robust aggregator. Run ids are `<attack><scale>_<agg>_s<seed>`.
#
# SEEDS="0 1 2" runs every row at each seed (default 0); PARALLEL=N runs N runs at a time (each
# takes one core); DRY_RUN=1 prints the commands instead (jobs/grid.sh). Extra arguments pass
# through to every run, e.g. `SEEDS="0 1 2" PARALLEL=16 jobs/ffgg/byzantine.sh --set run.rounds=600 --set
# output.dir=results/ffgg`.
set -uo pipefail
cd "$(dirname "$0")/../.."
GRID_EXTRA=("$@")
source jobs/grid.sh

add() {  # add AGG ID OVERRIDES...: the row's run at every seed (AGG: median, mean, or a robust.aggregator)
  local agg=$1 id=$2
  shift 2
  case $agg in
    median) set -- --set algorithm.name=br_ffgg --set "robust.aggregator={name: median, bucket_size: 2}" "$@" ;;
    mean) set -- --set algorithm.name=ffgg --set "robust.aggregator={name: mean, bucket_size: 1}" "$@" ;;
    *) set -- --set algorithm.name=br_ffgg --set "robust.aggregator=$agg" "$@" ;;
  esac
  grid_add "$id" rayfl run jobs/ffgg/quadratic_byzantine.yaml "$@"
}

for scale in 20 1; do
  for agg in median mean; do
    add $agg "sign_flip${scale}_$agg" --set robust.attack.name=sign_flip --set robust.attack.scale=$scale
  done
done
for agg in median mean; do
  add $agg "alie1_$agg" --set robust.attack.name=alie
  add $agg "alie_z10_$agg" --set robust.attack.name=alie --set robust.attack.z=10
done
for sigma in 1 10; do
  for agg in median mean; do
    add $agg "gaussian${sigma}_$agg" --set robust.attack.name=gaussian --set robust.attack.sigma=$sigma
  done
done
for agg in "trimmed_mean:{name: trimmed_mean, trim_fraction: 0.1, bucket_size: 1}" "krum:{name: krum, bucket_size: 1}" \
           "geometric_median:{name: geometric_median, bucket_size: 1}" \
           "centered_clipping:{name: centered_clipping, bucket_size: 1}"; do
  add "${agg#*:}" "gaussian1_${agg%%:*}" --set robust.attack.name=gaussian --set robust.attack.sigma=1
done
add mean none_mean --set robust.attack.name=none

grid_run
