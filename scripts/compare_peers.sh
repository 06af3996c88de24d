#!/usr/bin/env bash
# The fedavg-mlp workload on the plain PyTorch loop, rayfl, pfl-research and Flower, in one
# invocation (scripts/compare_peers.py). Each peer gets its own virtual environment with
# pinned versions under $RAYFL_PEERS_CACHE (default ~/.cache/rayfl-peers), built once and
# reused; pip's cache is reused too. Run from the repository root with rayfl's environment
# active:  scripts/compare_peers.sh [OUT.json]  (default bench/peers.json)
set -euo pipefail

PYTHON=${PYTHON:-python3}
CACHE=${RAYFL_PEERS_CACHE:-$HOME/.cache/rayfl-peers}
TORCH="torch==2.13.0"
declare -A SPECS=(
  [pfl]="pfl[pytorch]==0.6.0"
  [flower]="flwr[simulation]==1.42.0"
)

venv() {  # venv NAME: the environment's Python, built if missing or not matching its pins
  local name=$1 dir="$CACHE/$1" pins="$TORCH ${SPECS[$1]}"
  if [[ ! -x "$dir/bin/python" || "$(cat "$dir/.pins" 2>/dev/null)" != "$pins" ]]; then
    echo "building $dir ($pins)" >&2
    rm -rf "$dir" && "$PYTHON" -m venv "$dir"
    # torch first, so the peer's requirements cannot pull another build; TORCH_INDEX (e.g.
    # https://download.pytorch.org/whl/cpu) where PyPI's torch is not the CPU build wanted
    "$dir/bin/pip" install --quiet "$TORCH" ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} >&2
    "$dir/bin/pip" install --quiet "$TORCH" ${SPECS[$1]} >&2
    echo "$pins" > "$dir/.pins"
  fi
  echo "$dir/bin/python"
}

mkdir -p "$CACHE"
PFL=$(venv pfl)
FLOWER=$(venv flower)
unset RAY_ADDRESS  # every system starts its own local Ray, none joins a head
exec python "$(dirname "$0")/compare_peers.py" --peer "pfl-research=$PFL" --peer "flower=$FLOWER" \
  --out "${1:-bench/peers.json}" --work-dir "${WORK_DIR:-bench/peers}"
