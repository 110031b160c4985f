#!/bin/bash
# flux-cluster 0.1.0: the train job on this machine (system ondemand_h100x8), rendered from
# slurm/templates/local.sh.j2. torchrun starts one process per rank; repeats run one after the other.
# shellcheck disable=SC2317  # not every job calls every helper function below
set -euo pipefail
# ---- run settings (rendered by flux-cluster; every value is shell-quoted)
# As run.sub names them: NEXP=1, SEED_BASE=1234.
_fc_run_dir=/runs/train/20260101-000000-ondemand_h100x8
_fc_config=/runs/train/20260101-000000-ondemand_h100x8/config.yaml
_fc_results_dir=/runs/train/20260101-000000-ondemand_h100x8/results
export FLUX_RUN_DIR="$_fc_run_dir"
export FLUX_DATA_DIR=/data/flux1/energon

log() { printf '[flux-cluster %s] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }

# Secrets are passed by name from the submitting environment; their values are never written here.
_fc_secrets=(HF_TOKEN)
for _fc_secret in "${_fc_secrets[@]}"; do
    [[ -n "${!_fc_secret:-}" ]] || log "note: secret ${_fc_secret} is not set in the environment"
done

# ---- environment for every rank (system config: env)
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export NCCL_DEBUG=WARN
export CUDA_DEVICE_MAX_CONNECTIONS=32
export OMP_NUM_THREADS=8

mkdir -p "$_fc_results_dir" "$_fc_run_dir/state"

# Per-repeat settings: each repeat has its own seed and MLPerf log.
begin_experiment() {
    # The index comes from the loop below or from Slurm's array task id: digits only, before any arithmetic.
    [[ $1 =~ ^[0-9]+$ ]] || { log "error: repeat index '$1' is not a number"; exit 1; }
    export FLUX_EXP_INDEX=$((10#$1))
    export FLUX_SEED=$((1234 + FLUX_EXP_INDEX))
    export FLUX_RESULT_LOG="$_fc_results_dir/result_${FLUX_EXP_INDEX}.txt"
    export FLUX_CACHE_CLEARED=0
    log "repeat $((FLUX_EXP_INDEX + 1)) of 1 (index ${FLUX_EXP_INDEX}): seed ${FLUX_SEED}"
}

end_experiment() {
    touch "$_fc_run_dir/state/exp_${FLUX_EXP_INDEX}.done"
    log "repeat index ${FLUX_EXP_INDEX} finished"
}

run_experiment() {
    begin_experiment "$1"
    python3 -m flux_cluster.jobs.local_launch --standalone --nnodes=1 --nproc-per-node=8 \
        -m flux_cluster.jobs.train --config "$_fc_config"
    # the official checker; prints the one compliance line (passed / NON-CONFORMING: reasons / error)
    python3 -m flux_cluster.jobs.compliance --ruleset 6.1.0 \
        --log-output "$_fc_results_dir/compliance_${FLUX_EXP_INDEX}.log" "$FLUX_RESULT_LOG" || exit 1
    end_experiment
}

for ((_fc_exp = 0; _fc_exp < 1; _fc_exp++)); do
    run_experiment "$_fc_exp"
done
