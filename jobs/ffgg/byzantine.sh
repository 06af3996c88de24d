#!/usr/bin/env bash
# BR-FFGG with 10% Byzantine clients (3 of 32): {sign flip scaled by 20, sign flip, ALIE} x
# {bucketing(2) + coordinate-wise median, plain mean}. (An unscaled flip by 3 of 32 clients only
# shrinks the mean to 26/32 of the honest one, so plain averaging still converges: the scaled
# flip is the attack that breaks it.) Plus ALIE with z = 10 (Baruch's z_max is 0.157 for n = 32,
# f = 3). The plain mean is FFGG itself (`ffgg`, full participation as in the job) under the same
# attack: br_ffgg refuses a non-robust aggregator. Extra overrides pass through, e.g.
# `jobs/ffgg/byzantine.sh --set run.rounds=600`.
set -uo pipefail
cd "$(dirname "$0")/../.."
extra=("$@")  # saved: the loop below reuses the positional parameters

run() {  # run AGG RUN_ID OVERRIDES...: BR-FFGG's bucketed median, or FFGG's plain mean; one retry
  local agg=$1 id=$2
  shift 2
  if [ "$agg" = median ]; then
    set -- --set algorithm.name=br_ffgg --set "robust.aggregator={name: median, bucket_size: 2}" "$@"
  else
    set -- --set algorithm.name=ffgg --set "robust.aggregator={name: mean, bucket_size: 1}" "$@"
  fi
  for attempt in 1 2; do
    rayfl run jobs/ffgg/quadratic_byzantine.yaml "$@" --set run.run_id="$id" --set output.overwrite=true "${extra[@]}" && break
  done
}

for attack in "sign_flip 20" "sign_flip 1" "alie 1"; do
  set -- $attack
  for agg in median mean; do
    run $agg "${1}${2}_$agg" --set robust.attack.name=$1 --set robust.attack.scale=$2
  done
done
for agg in median mean; do
  run $agg "alie_z10_$agg" --set robust.attack.name=alie --set robust.attack.z=10
done
