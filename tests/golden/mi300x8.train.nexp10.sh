#!/bin/bash
#SBATCH --job-name=flux-train-mi300x8
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --time=15:10:00
#SBATCH --output=/runs/train/20260101-000000-mi300x8/slurm/%A_%a_0_log.out
#SBATCH --error=/runs/train/20260101-000000-mi300x8/slurm/%A_%a_0_log.err
#SBATCH --open-mode=append
#SBATCH --exclusive
#SBATCH --cpus-per-task=12
#SBATCH --mem=0
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --array=0-9
#
# flux-cluster 0.1.0: the train job on system mi300x8, rendered from
# slurm/templates/sbatch.sh.j2. Change the system config (or use --set) and render again rather than
# editing this file. Launch: one srun task per GPU (NVIDIA's run.sub convention), so Slurm places every
# rank; the time-limit signal reaches this shell, which relays it to the ranks in the containers.
# shellcheck disable=SC2317  # not every job calls every helper function below
set -euo pipefail
# ---- run settings (rendered by flux-cluster; every value is shell-quoted)
RUN_DIR=/runs/train/20260101-000000-mi300x8
CONFIG=/runs/train/20260101-000000-mi300x8/config.yaml
RESULTS_DIR=/runs/train/20260101-000000-mi300x8/results
NEXP=10
SEED_BASE=1234
export FLUX_RUN_DIR="$RUN_DIR"
export FLUX_DATA_DIR=/data

# ---- environment for every rank (system config: env)
export NCCL_DEBUG=WARN
export TORCH_NCCL_HIGH_PRIORITY=1
export HSA_FORCE_FINE_GRAIN_PCIE=1
export HIP_FORCE_DEV_KERNARG=1
export GPU_MAX_HW_QUEUES=2
export NCCL_MIN_NCHANNELS=112

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
RUNTIME=docker
# A requeued job keeps its id: the restart count keeps a leftover container from blocking the name.
CONTAINER_NAME=flux-cluster-"$SLURM_JOB_ID"-"${SLURM_RESTART_COUNT:-0}"
# Ranks register their PIDs here (inside the container) so a signal can be relayed to them alone.
export FLUX_PID_DIR=/tmp/flux-cluster-ranks
CONTAINER_IMAGE=flux-cluster:0.1.0-amd
# Variables reach 'exec' by name only; docker/podman take their values from the srun task's environment.
EXEC_ENV=(--env=SLURM_JOB_ID --env=SLURM_PROCID --env=SLURM_LOCALID --env=SLURM_NODEID --env=SLURM_NTASKS --env=SLURM_NTASKS_PER_NODE --env=SLURM_JOB_NUM_NODES --env=SLURM_RESTART_COUNT --env=SLURM_ARRAY_TASK_ID --env=MASTER_ADDR --env=MASTER_PORT --env=FLUX_RUN_DIR --env=FLUX_EXP_INDEX --env=FLUX_SEED --env=FLUX_RESULT_LOG --env=FLUX_CACHE_CLEARED --env=FLUX_DATA_DIR --env=FLUX_REQUEUE_MARKER --env=FLUX_PID_DIR --env=NCCL_DEBUG --env=TORCH_NCCL_HIGH_PRIORITY --env=HSA_FORCE_FINE_GRAIN_PCIE --env=HIP_FORCE_DEV_KERNARG --env=GPU_MAX_HW_QUEUES --env=NCCL_MIN_NCHANNELS --env=HF_TOKEN )
stop_containers() { on_hosts "$RUNTIME" rm --force "$CONTAINER_NAME" >/dev/null 2>&1 || true; }
trap stop_containers EXIT
# One long-lived container per node; ranks are started in it with 'exec'.
log "starting ${CONTAINER_IMAGE} as ${CONTAINER_NAME} on every node"
on_hosts "$RUNTIME" rm --force "$CONTAINER_NAME" >/dev/null 2>&1 || true
on_hosts "$RUNTIME" run --detach --rm --name="$CONTAINER_NAME" \
    --device=/dev/kfd --device=/dev/dri \
    --ipc=host --network=host --ulimit=memlock=-1 --ulimit=stack=67108864 \
    --volume=/mnt/mlperf/flux1/energon:/data:ro \
    --volume=/runs/train/20260101-000000-mi300x8:/runs/train/20260101-000000-mi300x8 \
    --shm-size=64g \
    --cap-add=SYS_PTRACE \
    --security-opt=seccomp=unconfined \
    --group-add=video \
    --workdir=/workspace/flux-cluster "$CONTAINER_IMAGE" sleep infinity
on_ranks() { srun --ntasks-per-node=8 --kill-on-bad-exit=1 "$RUNTIME" exec "${EXEC_ENV[@]}" "$CONTAINER_NAME" "$@"; }
on_nodes() { srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 "$RUNTIME" exec "${EXEC_ENV[@]}" "$CONTAINER_NAME" "$@"; }
on_one() { srun --ntasks=1 --nodes=1 "$RUNTIME" exec "${EXEC_ENV[@]}" "$CONTAINER_NAME" "$@"; }
# Slurm signals this batch shell (--signal=B:USR1): relay it to the registered ranks in every container.
relay_signal() {
    log "SIGUSR1: relaying it to the ranks"
    srun --overlap --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 "$RUNTIME" exec --env=FLUX_PID_DIR \
        "$CONTAINER_NAME" python -m flux_cluster.jobs.signals relay || log "warning: the relay failed"
}
trap relay_signal USR1

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

run_experiment "$SLURM_ARRAY_TASK_ID"
