#!/usr/bin/env bash
# FFGG Fig. 1(a): Alg. 1 with tau CG steps, tau in {1, 2, 5, 10, 40}, 2000 rounds.
# Usage: jobs/ffgg/fig1a.sh [extra --set overrides]; then: rayfl report <output.dir>
# (a run whose Ray start times out on a busy machine is retried once)
set -uo pipefail
cd "$(dirname "$0")/../.."
for tau in 1 2 5 10 40; do
  for attempt in 1 2; do
    rayfl run jobs/ffgg/quadratic_fig1a.yaml --set algorithm.tau=$tau --set run.run_id=cg_tau$tau \
      --set output.overwrite=true "$@" && break
  done
done
