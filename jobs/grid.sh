# Sourced by the replication scripts (jobs/<paper>/*.sh): collect a grid of `rayfl run` commands,
# each at every seed of SEEDS under its own run id, then run them PARALLEL at a time.
#
#   source jobs/grid.sh
#   grid_add ID rayfl run JOB --set ...   # the run at each seed of SEEDS, id ID_s<seed>
#   grid_run                              # run them all (DRY_RUN=1: print them instead)
#
# SEEDS="0 1 2" (default 0); PARALLEL=N runs at a time (default 1; each run takes about one
# core); DRY_RUN=1 prints the commands. GRID_EXTRA (an array, set it before grid_add) goes to
# the end of every command: the script's own extra arguments, e.g. --set output.dir=results/ffgg.
# A run that fails is started once more (a Ray start can time out on a busy machine); grid_run's
# exit status is 1 when a run failed twice. Each seed's run overwrites an earlier run of the same
# id (output.overwrite=true), never another seed's.

SEEDS=${SEEDS:-0}
PARALLEL=${PARALLEL:-1}
GRID_COMMANDS=()
GRID_EXTRA=(${GRID_EXTRA[@]+"${GRID_EXTRA[@]}"})

grid_add() {
  local id=$1 seed
  shift
  for seed in $SEEDS; do
    GRID_COMMANDS+=("$(printf '%q ' "$@" --set run.seed="$seed" --set run.run_id="${id}_s$seed" \
      --set output.overwrite=true ${GRID_EXTRA[@]+"${GRID_EXTRA[@]}"})")
  done
}

grid_run() {
  if [ -n "${DRY_RUN:-}" ]; then
    printf '%s\n' "${GRID_COMMANDS[@]}"
    return 0
  fi
  local failed=0 running=0 command
  for command in "${GRID_COMMANDS[@]}"; do
    (eval "$command" || eval "$command") &
    if (( ++running >= PARALLEL )); then
      wait -n || failed=1
      (( running-- ))
    fi
  done
  while (( running-- > 0 )); do
    wait -n || failed=1
  done
  return $failed
}
