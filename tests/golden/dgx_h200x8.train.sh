#!/bin/bash
#SBATCH --job-name=flux-train-dgx_h200x8
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --time=11:10:00
#SBATCH --output=/runs/train/20260101-000000-dgx_h200x8/slurm/%j_0_log.out
#SBATCH --error=/runs/train/20260101-000000-dgx_h200x8/slurm/%j_0_log.err
#SBATCH --open-mode=append
#SBATCH --exclusive
#SBATCH --cpus-per-task=14
#SBATCH --mem=0
#SBATCH --requeue
#SBATCH --signal=USR1@300
#
# flux-cluster 0.1.0: the train job on system dgx_h200x8, rendered from
# slurm/templates/sbatch.sh.j2. Change the system config (or use --set) and render again rather than
# editing this file. Launch: one srun task per GPU (NVIDIA's run.sub convention), so Slurm places every
# rank and delivers the time-limit signal to each one directly.
# shellcheck disable=SC2317  # not every job calls every helper function below
set -euo pipefail
# ---- run settings (rendered by flux-cluster; every value is shell-quoted)
RUN_DIR=/runs/train/20260101-000000-dgx_h200x8
CONFIG=/runs/train/20260101-000000-dgx_h200x8/config.yaml
RESULTS_DIR=/runs/train/20260101-000000-dgx_h200x8/results
NEXP=1
SEED_BASE=1234
export FLUX_RUN_DIR="$RUN_DIR"
export FLUX_DATA_DIR=/data

# ---- environment for every rank (system config: env)
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export NCCL_DEBUG=WARN
export NCCL_NVLS_ENABLE=1
export CUDA_DEVICE_MAX_CONNECTIONS=32

log() { printf '[flux-cluster %s] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }

# Secrets are passed by name from the submitting environment; their values are never written here.
SECRET_NAMES=(HF_TOKEN)
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

# ---- rendezvous: srun puts rank 0 (SLURM_PROCID 0) on the allocation's first node, which hosts the store.
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(sinfo --noheader --Node --nodes="$HEAD_NODE" --format=%o | head -n 1) || MASTER_ADDR=""
if [[ -z "$MASTER_ADDR" ]]; then
    log "warning: no node address from sinfo; using the node name ${HEAD_NODE}"
    MASTER_ADDR=$HEAD_NODE
fi
export MASTER_ADDR
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
# A rank that checkpointed after SIGUSR1 writes this file (flux_cluster/jobs/signals.py); we then requeue.
export FLUX_REQUEUE_MARKER="$RUN_DIR/state/requeue-${SLURM_JOB_ID}"
rm -f "$FLUX_REQUEUE_MARKER"
scontrol show hostnames "$SLURM_JOB_NODELIST" | sort > "$RUN_DIR/state/hostfile.${SLURM_JOB_ID}"
log "job ${SLURM_JOB_ID} on ${SLURM_JOB_NUM_NODES} node(s), rendezvous ${MASTER_ADDR}:${MASTER_PORT}, restart ${SLURM_RESTART_COUNT:-0}"

# ---- where ranks run: on_ranks (one task per GPU), on_nodes (one per node), on_one (a single task),
# all inside the container; on_hosts runs one task per node outside it.
on_hosts() { srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 "$@"; }
CONTAINER_NAME=flux-cluster-"$SLURM_JOB_ID"
CONTAINER_IMAGE=/lustre/mlperf/images/flux-cluster+0.1.0-nvidia.sqsh
CONTAINER_MOUNTS=/lustre/mlperf/flux1/energon:/data:ro,/runs/train/20260101-000000-dgx_h200x8:/runs/train/20260101-000000-dgx_h200x8
CONTAINER_ENV=TORCH_NCCL_ASYNC_ERROR_HANDLING,NCCL_DEBUG,NCCL_NVLS_ENABLE,CUDA_DEVICE_MAX_CONNECTIONS,HF_TOKEN
PYXIS_ARGS=(--container-name="$CONTAINER_NAME" --container-mounts="$CONTAINER_MOUNTS"
    --container-workdir=/workspace/flux-cluster --no-container-mount-home
    --container-env="$CONTAINER_ENV"
)
# Pyxis imports the image once per node here; every later step reuses the named container.
log "importing ${CONTAINER_IMAGE} as ${CONTAINER_NAME}"
on_hosts --container-image="$CONTAINER_IMAGE" --container-name="$CONTAINER_NAME" true
on_ranks() { srun --ntasks-per-node=8 --kill-on-bad-exit=1 --mpi=pmix --cpu-bind=none "${PYXIS_ARGS[@]}" "$@"; }
on_nodes() { srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 "${PYXIS_ARGS[@]}" "$@"; }
on_one() { srun --ntasks=1 --nodes=1 "${PYXIS_ARGS[@]}" "$@"; }

# A trapped signal interrupts 'wait'; keep waiting until the step has really ended.
wait_step() {
    local pid=$1 rc=0
    while :; do
        if wait "$pid"; then return 0; else rc=$?; fi
        kill -0 "$pid" 2>/dev/null || return "$rc"
    done
}

log "checking the data root ${FLUX_DATA_DIR} on every node"
if ! on_nodes test -d "$FLUX_DATA_DIR" -a -r "$FLUX_DATA_DIR" -a -x "$FLUX_DATA_DIR"; then
    log "error: the data root ${FLUX_DATA_DIR} is not mounted or not readable on every node"
    exit 1
fi

run_experiment() {
    local rc=0
    begin_experiment "$1"
    if on_hosts bash -c 'sync && sudo -n /sbin/sysctl -q vm.drop_caches=3'; then
        FLUX_CACHE_CLEARED=1
    else
        log "warning: could not drop the page cache (needs passwordless sudo on the nodes)"
    fi
    log "all_reduce bandwidth test across all ranks"
    if ! on_ranks python -m flux_cluster.jobs.preflight --config "$CONFIG" --comm-only; then
        log "error: the all_reduce test failed: not starting experiment ${FLUX_EXP_INDEX}"
        return 1
    fi
    on_ranks python -m flux_cluster.train --config "$CONFIG" &
    wait_step $! || rc=$?
    if [[ -e "$FLUX_REQUEUE_MARKER" ]]; then
        rm -f "$FLUX_REQUEUE_MARKER"
        log "the ranks checkpointed after SIGUSR1: requeueing job ${SLURM_JOB_ID}"
        if ! scontrol requeue "$SLURM_JOB_ID"; then
            log "error: scontrol requeue failed; resubmit the run to resume from its checkpoint"
            exit 1
        fi
        exit 0
    fi
    if (( rc == 3 )); then
        log "experiment ${FLUX_EXP_INDEX} ended without reaching the quality target (exit code 3)"
        return "$rc"
    fi
    (( rc == 0 )) || { log "experiment ${FLUX_EXP_INDEX} failed with exit code ${rc}"; return "$rc"; }
    on_one python -m mlperf_logging.compliance_checker --usage training --ruleset 6.1.0 \
        --log_output "$RESULTS_DIR/compliance_${FLUX_EXP_INDEX}.log" "$FLUX_RESULT_LOG" \
        || log "warning: ${FLUX_RESULT_LOG} failed the MLPerf compliance check"
    end_experiment
}

status=0
for ((exp = 0; exp < NEXP; exp++)); do
    if [[ -e "$RUN_DIR/state/exp_${exp}.done" ]]; then
        log "experiment ${exp} already finished before a requeue, skipping"
        continue
    fi
    run_experiment "$exp" || status=$?
done
exit "$status"
