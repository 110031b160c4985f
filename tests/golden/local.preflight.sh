#!/bin/bash
# flux-cluster 0.1.0: the preflight job on this machine (system local), rendered from
# slurm/templates/local.sh.j2. torchrun starts one process per rank; repeats run one after the other.
# shellcheck disable=SC2317  # not every job calls every helper function below
set -euo pipefail
# ---- run settings (rendered by flux-cluster; every value is shell-quoted)
RUN_DIR=/runs/preflight/20260101-000000-local
CONFIG=/runs/preflight/20260101-000000-local/config.yaml
RESULTS_DIR=/runs/preflight/20260101-000000-local/results
NEXP=1
SEED_BASE=1234
export FLUX_RUN_DIR="$RUN_DIR"

# ---- environment for every rank (system config: env)
export OMP_NUM_THREADS=1

log() { printf '[flux-cluster %s] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }

# Secrets are passed by name from the submitting environment; their values are never written here.
SECRET_NAMES=()
for secret_name in "${SECRET_NAMES[@]}"; do
    [[ -n "${!secret_name:-}" ]] || log "note: secret ${secret_name} is not set in the environment"
done

mkdir -p "$RESULTS_DIR" "$RUN_DIR/state"

# Per-repeat settings: each repeat has its own seed and MLPerf log.
begin_experiment() {
    export FLUX_EXP_INDEX="$1"
    export FLUX_SEED=$((SEED_BASE + FLUX_EXP_INDEX))
    export FLUX_RESULT_LOG="$RESULTS_DIR/result_${FLUX_EXP_INDEX}.txt"
    export FLUX_CACHE_CLEARED=0
    log "repeat $((FLUX_EXP_INDEX + 1)) of ${NEXP} (index ${FLUX_EXP_INDEX}): seed ${FLUX_SEED}"
}

end_experiment() {
    touch "$RUN_DIR/state/exp_${FLUX_EXP_INDEX}.done"
    log "repeat index ${FLUX_EXP_INDEX} finished"
}

run_experiment() {
    begin_experiment "$1"
    python3 -m flux_cluster.jobs.local_launch --standalone --nnodes=1 --nproc-per-node=2 \
        -m flux_cluster.jobs.preflight --config "$CONFIG"
    end_experiment
}

for ((exp = 0; exp < NEXP; exp++)); do
    run_experiment "$exp"
done
