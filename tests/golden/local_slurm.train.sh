#!/bin/bash
#SBATCH --job-name=flux-train-local_slurm
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:15:00
#SBATCH --output=/runs/train/20260101-000000-local_slurm/slurm/%j_0_log.out
#SBATCH --error=/runs/train/20260101-000000-local_slurm/slurm/%j_0_log.err
#SBATCH --open-mode=append
#SBATCH --partition=debug
#SBATCH --cpus-per-task=1
#SBATCH --mem-per-cpu=1000
#SBATCH --requeue
#SBATCH --signal=USR1@60
#
# flux-cluster 0.1.0: the train job on system local_slurm, rendered from
# slurm/templates/sbatch.sh.j2. Change the system config (or use --set) and render again rather than
# editing this file. Launch: one srun task per GPU (NVIDIA's run.sub convention), so Slurm places every
# rank and delivers the time-limit signal to each one directly.
# shellcheck disable=SC2317  # not every job calls every helper function below
set -euo pipefail
# ---- run settings (rendered by flux-cluster; every value is shell-quoted)
RUN_DIR=/runs/train/20260101-000000-local_slurm
CONFIG=/runs/train/20260101-000000-local_slurm/config.yaml
RESULTS_DIR=/runs/train/20260101-000000-local_slurm/results
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
on_ranks() { srun --ntasks-per-node=1 --kill-on-bad-exit=1 "$@"; }
on_nodes() { on_hosts "$@"; }
on_one() { srun --ntasks=1 --nodes=1 "$@"; }

# A trapped signal interrupts 'wait'; keep waiting until the step has really ended.
wait_step() {
    local pid=$1 rc=0
    while :; do
        if wait "$pid"; then return 0; else rc=$?; fi
        kill -0 "$pid" 2>/dev/null || return "$rc"
    done
}


run_experiment() {
    local rc=0
    begin_experiment "$1"
    on_ranks python3 -m flux_cluster.train --config "$CONFIG" &
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
    on_one python3 -m mlperf_logging.compliance_checker --usage training --ruleset 6.1.0 \
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
