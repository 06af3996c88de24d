#!/usr/bin/env bash
# Asynchronous FFGG with heavy-tailed delays (theory dispatch), and the worker-dispatch variant.
set -uo pipefail
cd "$(dirname "$0")/../.."
for mode in theory worker; do
  for attempt in 1 2; do
    rayfl run jobs/ffgg/quadratic_async.yaml --set algorithm.dispatch=$mode --set run.run_id=async_$mode \
      --set output.overwrite=true "$@" && break
  done
done
