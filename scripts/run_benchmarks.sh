#!/usr/bin/env bash
# Every CPU bench that docs/benchmarks.md shows, one after another at one commit, each writing
# its JSON into one directory; scripts/gen_benchmarks.py (its CPU names that directory) then
# renders the page from them. Run from the repository root with rayfl's environment active, on a quiet machine
# (nothing else running: the tables compare timings taken minutes apart):
#   scripts/run_benchmarks.sh docs/benchmarks/cpu-$(date -u +%F)
# ONLY="scale driver" runs just those benches (names as in the list below). `zo` reads MNIST
# from the jobs' data directory: RAYFL_DATA_DIR where the files are offline.
set -euo pipefail

OUT=${1:?usage: scripts/run_benchmarks.sh OUT_DIR}
mkdir -p "$OUT"
export RAY_USAGE_STATS_ENABLED=0

bench() {  # bench NAME COMMAND...: run COMMAND unless ONLY leaves NAME out; say how long it took
  local name=$1
  shift
  if [[ -n "${ONLY:-}" && " $ONLY " != *" $name "* ]]; then
    return
  fi
  local start=$SECONDS
  echo "== $name: $*" >&2
  "$@" >"$OUT/$name.log" 2>&1 || { echo "$name failed; its log: $OUT/$name.log" >&2; exit 1; }
  echo "== $name: $((SECONDS - start)) s" >&2
}

bench peers scripts/compare_peers.sh "$OUT/peers.json"
bench fedavg-mlp rayfl bench fedavg-mlp --vectorize auto,off --hosts 2 --preaggregate on --repeat 5 --out "$OUT/fedavg-mlp.json"
bench fedprox-mlp rayfl bench fedprox-mlp --vectorize auto --hosts 2 --preaggregate on --repeat 5 --out "$OUT/fedprox-mlp.json"
bench femnist-cnn rayfl bench femnist-cnn --vectorize auto --repeat 3 --out "$OUT/femnist-cnn.json"
bench shakespeare-lstm rayfl bench shakespeare-lstm --vectorize auto --repeat 3 --out "$OUT/shakespeare-lstm.json"
bench cifar-resnet rayfl bench cifar-resnet --vectorize auto --repeat 3 --out "$OUT/cifar-resnet.json"
bench scale rayfl bench scale --clients 10000,1000000,100000000,1000000000 --per-round 1000 --rounds 10 --out "$OUT/scale.json"
bench driver rayfl bench driver --hosts 2,4,8,16,32 --rounds 40 --out "$OUT/driver.json"
bench memory rayfl bench memory --clients 10,40,100,400 --out "$OUT/memory.json"
bench async rayfl bench async --clients 1000 --vectorize auto,off --out "$OUT/async.json"
bench sweep rayfl bench sweep --sizes 6,48 --out "$OUT/sweep.json"
bench startup rayfl bench startup --repeat 3 --out "$OUT/startup.json"
bench zo rayfl bench zo --rounds 6 --vectorize off,on --out "$OUT/zo.json"
