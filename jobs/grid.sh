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
# The first run goes alone (it downloads and caches the data the others then read), the rest
# PARALLEL at a time. A run that fails is started once more (a Ray start can time out on a busy
# machine); grid_run's exit status is 1 when a run failed twice. A run that exits 2 (bad input,
# or data that is missing: rayfl says which in one line) is not retried and starts no further
# run: grid_run waits for the runs under way and exits 2, so a grid without its data stops after
# the first run's one line. Each seed's run overwrites an earlier run of the same
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
  local failed=0 running=0 first=1 command
  for command in "${GRID_COMMANDS[@]}"; do
    (( failed == 2 )) && break
    (eval "$command" || { status=$?; (( status == 2 )) && exit 2; eval "$command"; }) &
    if (( ++running >= PARALLEL || first )); then
      first=0
      wait -n
      _grid_failed $?
      (( running-- ))
    fi
  done
  while (( running-- > 0 )); do
    wait -n
    _grid_failed $?
  done
  return $failed
}

_grid_failed() {  # the grid's status after a run ended with status $1: 2 wins over 1 over 0
  if (( $1 == 2 )); then
    failed=2
  elif (( $1 != 0 && failed == 0 )); then
    failed=1
  fi
}
