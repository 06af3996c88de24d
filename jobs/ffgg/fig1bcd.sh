#!/usr/bin/env bash
# FFGG Fig. 1(b-d): FFGG (GD fine-tuner) vs Local GD, SCAFFOLD, L2GD at tau in {100, 200, 500}.
set -uo pipefail
cd "$(dirname "$0")/../.."
for tau in ${TAUS:-100 200 500}; do
  for m in ffgg local_gd scaffold l2gd; do
    for attempt in 1 2; do
      rayfl run jobs/ffgg/quadratic_fig1bcd_$m.yaml --set algorithm.tau=$tau --set run.run_id=${m}_tau$tau \
        --set output.overwrite=true "$@" && break
    done
  done
done
