#!/usr/bin/env bash
# BR-FFGG with 10% Byzantine clients (3 of 32): {sign flip scaled by 20, sign flip, ALIE} x
# {bucketing(2) + coordinate-wise median, plain mean}. (An unscaled flip by 3 of 32 clients only
# shrinks the mean to 26/32 of the honest one, so plain averaging still converges: the scaled
# flip is the attack that breaks it.) Plus ALIE with z = 10 (Baruch's z_max is 0.157 for n = 32,
# f = 3). Extra overrides pass through, e.g. `jobs/ffgg/byzantine.sh --set run.rounds=600`.
set -uo pipefail
cd "$(dirname "$0")/../.."
extra=("$@")  # saved: the loop below reuses the positional parameters
for attack in "sign_flip 20" "sign_flip 1" "alie 1"; do
  set -- $attack
  for agg in median mean; do
    bucket=$([ $agg = median ] && echo 2 || echo 1)
    for attempt in 1 2; do
      rayfl run jobs/ffgg/quadratic_byzantine.yaml --set algorithm.attack.name=$1 --set algorithm.attack.scale=$2 \
        --set "algorithm.aggregator={name: $agg, bucket_size: $bucket}" --set run.run_id=${1}${2}_$agg \
        --set output.overwrite=true "${extra[@]}" && break
    done
  done
done
for agg in median mean; do
  bucket=$([ $agg = median ] && echo 2 || echo 1)
  for attempt in 1 2; do
    rayfl run jobs/ffgg/quadratic_byzantine.yaml --set algorithm.attack.name=alie --set algorithm.attack.z=10 \
      --set "algorithm.aggregator={name: $agg, bucket_size: $bucket}" --set run.run_id=alie_z10_$agg \
      --set output.overwrite=true "${extra[@]}" && break
  done
done
