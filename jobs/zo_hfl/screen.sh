#!/usr/bin/env bash
# The tuning screen of ZO-HFL's headline Table I cell (MNIST, alpha = 0.1, beta = 10%): what the
# paper does not fix, one factor (or one small product) at a time around the jobs' defaults,
# one `rayfl sweep` per factor named zohfl_screen_<factor>, one seed, R = ROUNDS (default 100, shorter than
# the paper's 500: a screen). `rayfl report <output.dir>` lists every variant as a Table I row.
#
#   jobs/zo_hfl/screen.sh --set data.source=test_only --set output.dir=/tmp/screen     # offline
#   ROUNDS=500 SEEDS=0,1,2 FACTORS="lam" jobs/zo_hfl/screen.sh ...                      # one factor, in full
#
# ZO-HFL: lam, mu, eta, client batch size, the aggregation under partial participation
# (`participants` self-normalised, `unbiased` sum over S_r of (m/|S_r|) rho_i, `all_clients`),
# the starting point (x_0 = 0 or the model's init), n in n/(2 eta) (7,840 parameters or 784
# features) x v in S or in eta S. Baselines: the local step (constant 0.1 or 0.1/(t+1)), their
# start (PyTorch's init or x_0 = 0, as ZO-HFL), FedProx mu in {0.01, 0.1, 1}. `share`: the
# server's share of the training pool (data.server_fraction 0.1 / 0.6; 0.3 is the paper's) for
# ZO-HFL and FedAvg.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-100}
SEEDS=${SEEDS:-0}
MAX_CONCURRENT=${MAX_CONCURRENT:-2}
FACTORS=${FACTORS:-"lam mu eta batch aggregation readings fedavg fedprox scaffold"}
ZEROS=${ZEROS:-/tmp/zohfl_zeros7840.npy}            # x_0 = 0 for the baselines' linear 784 x 10 model
python -c "import numpy as np; np.save('$ZEROS', np.zeros(7840, np.float32))"
common=(--seeds "$SEEDS" --max-concurrent "$MAX_CONCURRENT" --set "run.rounds=$ROUNDS" --set engine.num_hosts=1
        --set partition.alpha=0.1 --set algorithm.participation=0.1)
sweep() {  # sweep NAME METHOD GRID...
  local name=$1 method=$2
  shift 2
  echo "== screen $name ($method)" >&2
  rayfl sweep "jobs/zo_hfl/table1_${method}.yaml" --name "zohfl_screen_${name}" "${common[@]}" "$@" "${EXTRA[@]}"
}
EXTRA=("$@")
for factor in $FACTORS; do
  case $factor in
    lam) sweep lam zo_hfl --grid algorithm.lam=0,0.1,0.3 ;;
    mu) sweep mu zo_hfl --grid algorithm.mu=0.01,1,10 ;;
    eta) sweep eta zo_hfl --grid algorithm.eta=0.01,1 ;;
    batch) sweep batch zo_hfl --grid algorithm.batch_size=16,256 ;;
    aggregation) sweep aggregation zo_hfl --grid algorithm.aggregation=participants,unbiased,all_clients --grid algorithm.init=zeros,model ;;
    readings) sweep readings zo_hfl --grid algorithm.zo_dimension=null,784 --grid algorithm.direction_radius=unit,eta ;;
    fedavg) sweep fedavg fedavg --grid algorithm.lr_schedule=harmonic,constant --grid "model.init_from=[null, \"$ZEROS\"]" ;;
    fedprox) sweep fedprox fedprox --grid algorithm.mu=0.01,0.1,1 --grid algorithm.lr_schedule=harmonic,constant ;;
    scaffold) sweep scaffold scaffold --grid algorithm.lr_schedule=harmonic,constant ;;
    share) sweep share_zo_hfl zo_hfl --grid data.server_fraction=0.1,0.6
           sweep share_fedavg fedavg --grid data.server_fraction=0.1,0.6 ;;
    *) echo "unknown factor $factor" >&2; exit 2 ;;
  esac
done
