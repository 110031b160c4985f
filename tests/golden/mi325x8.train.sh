#!/bin/bash
#SBATCH --job-name=flux-train-mi325x8
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --time=13:10:00
#SBATCH --output=/runs/train/20260101-000000-mi325x8/slurm/%j_0_log.out
#SBATCH --error=/runs/train/20260101-000000-mi325x8/slurm/%j_0_log.err
#SBATCH --open-mode=append
#SBATCH --exclusive
#SBATCH --cpus-per-task=12
#SBATCH --mem=0
#SBATCH --export=ALL,HF_TOKEN=
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#
# flux-cluster 0.1.0: the train job on system mi325x8, rendered from
# slurm/templates/sbatch.sh.j2. Change the system config (or use --set) and render again rather than
# editing this file. Launch: one srun task per GPU (NVIDIA's run.sub convention), so Slurm places every
# rank; the time-limit signal reaches this shell, which relays it to the ranks in the containers.
# shellcheck disable=SC2317  # not every job calls every helper function below
set -euo pipefail
# ---- run settings (rendered by flux-cluster; every value is shell-quoted)
# As run.sub names them: NEXP=1, SEED_BASE=1234.
_fc_run_dir=/runs/train/20260101-000000-mi325x8
_fc_config=/runs/train/20260101-000000-mi325x8/config.yaml
_fc_results_dir=/runs/train/20260101-000000-mi325x8/results
export FLUX_RUN_DIR="$_fc_run_dir"
export FLUX_DATA_DIR=/data

log() { printf '[flux-cluster %s] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }

# Secrets are read here, at run time, from the submitting user's private folder (one file of mode 0600
# per name, written by 'flux-cluster submit'); '#SBATCH --export' above blanks them, so no value passes
# through Slurm's saved job environment, and none is written in this script.
_fc_secrets_dir=${FLUX_CLUSTER_SECRETS:-${HOME:-}/.config/flux-cluster/secrets}
_fc_secrets=(HF_TOKEN)
for _fc_secret in "${_fc_secrets[@]}"; do
    if [[ -r "$_fc_secrets_dir/$_fc_secret" ]]; then
        IFS= read -r -d '' "${_fc_secret?}" < "$_fc_secrets_dir/$_fc_secret" || true
        export "${_fc_secret?}"
    fi
    [[ -n "${!_fc_secret:-}" ]] || log "note: secret ${_fc_secret} is not set (no ${_fc_secrets_dir}/${_fc_secret})"
done
# sbatch hands its --export on to every srun as SLURM_EXPORT_ENV; the steps must see the secrets read above.
export SLURM_EXPORT_ENV=ALL

# ---- environment for every rank (system config: env)
export NCCL_DEBUG=WARN
export TORCH_NCCL_HIGH_PRIORITY=1
export HSA_FORCE_FINE_GRAIN_PCIE=1
export HIP_FORCE_DEV_KERNARG=1
export GPU_MAX_HW_QUEUES=2
export NCCL_MIN_NCHANNELS=112

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

# ---- rendezvous: srun puts rank 0 (SLURM_PROCID 0) on the allocation's first node, which hosts the store.
_fc_head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(sinfo --noheader --Node --nodes="$_fc_head_node" --format=%o | head -n 1) || MASTER_ADDR=""
if [[ -z "$MASTER_ADDR" ]]; then
    log "warning: no node address from sinfo; using the node name ${_fc_head_node}"
    MASTER_ADDR=$_fc_head_node
fi
export MASTER_ADDR
# Digits only before the arithmetic: bash would run a '$(...)' inside an array subscript there.
[[ $SLURM_JOB_ID =~ ^[0-9]+$ ]] || { log "error: SLURM_JOB_ID '${SLURM_JOB_ID}' is not a number"; exit 1; }
export MASTER_PORT=$((20000 + 10#$SLURM_JOB_ID % 20000))
# A rank that checkpointed after SIGUSR1 writes this file (flux_cluster/runtime/signals.py); we then requeue.
export FLUX_REQUEUE_MARKER="$_fc_run_dir/state/requeue-${SLURM_JOB_ID}"
rm -f "$FLUX_REQUEUE_MARKER"
scontrol show hostnames "$SLURM_JOB_NODELIST" | sort > "$_fc_run_dir/state/hostfile.${SLURM_JOB_ID}"
log "job ${SLURM_JOB_ID} on ${SLURM_JOB_NUM_NODES} node(s), rendezvous ${MASTER_ADDR}:${MASTER_PORT}, restart ${SLURM_RESTART_COUNT:-0}"

# ---- where ranks run: on_ranks (one task per GPU), on_nodes (one per node), on_one (a single task),
# all inside the container; on_hosts runs one task per node outside it.
on_hosts() { srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 "$@"; }
_fc_runtime=docker
# A requeued job keeps its id: the restart count keeps a leftover container from blocking the name.
_fc_container_name=flux-cluster-"$SLURM_JOB_ID"-"${SLURM_RESTART_COUNT:-0}"
# Ranks register their PIDs here (inside the container) so a signal can be relayed to them alone.
export FLUX_PID_DIR=/tmp/flux-cluster-ranks
_fc_container_image=flux-cluster:0.1.0-amd
# Variables reach 'exec' by name only; docker/podman take their values from the srun task's environment.
_fc_exec_env=(--env=SLURM_JOB_ID --env=SLURM_PROCID --env=SLURM_LOCALID --env=SLURM_NODEID --env=SLURM_NTASKS --env=SLURM_NTASKS_PER_NODE --env=SLURM_JOB_NUM_NODES --env=SLURM_RESTART_COUNT --env=SLURM_ARRAY_TASK_ID --env=MASTER_ADDR --env=MASTER_PORT --env=FLUX_RUN_DIR --env=FLUX_EXP_INDEX --env=FLUX_SEED --env=FLUX_RESULT_LOG --env=FLUX_CACHE_CLEARED --env=FLUX_DATA_DIR --env=FLUX_REQUEUE_MARKER --env=FLUX_PID_DIR --env=NCCL_DEBUG --env=TORCH_NCCL_HIGH_PRIORITY --env=HSA_FORCE_FINE_GRAIN_PCIE --env=HIP_FORCE_DEV_KERNARG --env=GPU_MAX_HW_QUEUES --env=NCCL_MIN_NCHANNELS --env=HF_TOKEN )
stop_containers() { on_hosts "$_fc_runtime" rm --force "$_fc_container_name" >/dev/null 2>&1 || true; }
trap stop_containers EXIT
# One long-lived container per node; ranks are started in it with 'exec'.
log "starting ${_fc_container_image} as ${_fc_container_name} on every node"
on_hosts "$_fc_runtime" rm --force "$_fc_container_name" >/dev/null 2>&1 || true
# The container is given the node's GPUs (it escapes the step's device cgroup) but must see only those Slurm
# gave this job there: the bash that starts it on each node sets its ROCR_VISIBLE_DEVICES first.
_fc_own_gpus() {
    local _fc_slurm=${SLURM_STEP_GPUS:-}
    # Slurm's indices, taken as ROCr's (both count the GPUs in PCI bus order where Slurm detects them itself):
    # rocm-smi reads sysfs, which shows every GPU of the node whatever the step may open, so it cannot say
    # which are the step's.
    if [[ -n $_fc_slurm ]]; then
        export ROCR_VISIBLE_DEVICES=$_fc_slurm
    else  # the job asked for GPUs by GRES: never every GPU of the node
        echo "error: on $(uname -n): the job asked Slurm for GPUs, but this step names none (SLURM_STEP_GPUS is empty; SLURM_STEP_GRES=none where it was submitted, or GRES with no device files?): not starting a container that would see every GPU of the node" >&2
        return 1
    fi
}
# shellcheck disable=SC2016  # "$@" is expanded by the bash on each node
on_hosts bash -c "$(declare -f _fc_own_gpus)"'; _fc_own_gpus && exec "$@"' own_gpus "$_fc_runtime" run --detach --rm --name="$_fc_container_name" \
    --env=ROCR_VISIBLE_DEVICES --device=/dev/kfd --device=/dev/dri \
    --ipc=host --network=host --ulimit=memlock=-1 --ulimit=stack=67108864 \
    --volume=/mnt/mlperf/flux1/energon:/data:ro \
    --volume=/runs/train/20260101-000000-mi325x8:/runs/train/20260101-000000-mi325x8 \
    --shm-size=64g \
    --cap-add=SYS_PTRACE \
    --security-opt=seccomp=unconfined \
    --group-add=video \
    --workdir=/workspace/flux-cluster "$_fc_container_image" sleep infinity
on_ranks() { srun --ntasks-per-node=8 --kill-on-bad-exit=1 "$_fc_runtime" exec "${_fc_exec_env[@]}" "$_fc_container_name" "$@"; }
on_nodes() { srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 "$_fc_runtime" exec "${_fc_exec_env[@]}" "$_fc_container_name" "$@"; }
on_one() { srun --ntasks=1 --nodes=1 "$_fc_runtime" exec "${_fc_exec_env[@]}" "$_fc_container_name" "$@"; }
# Slurm signals this batch shell (--signal=B:USR1): relay it to the registered ranks in every container.
relay_signal() {
    log "SIGUSR1: relaying it to the ranks"
    srun --overlap --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 "$_fc_runtime" exec --env=FLUX_PID_DIR \
        "$_fc_container_name" python -m flux_cluster.jobs.signals relay || log "warning: the relay failed"
}
trap relay_signal USR1

# Requeue this job, which resumes from its last checkpoint; exits.
requeue_job() {
    log "$1: requeueing job ${SLURM_JOB_ID}"
    if ! scontrol requeue "$SLURM_JOB_ID"; then
        log "error: scontrol requeue failed; resubmit the run to resume from its checkpoint"
        exit 1
    fi
    exit 0
}

# After a crash, at most slurm.max_requeues times per run (counted in state/), so a fault that recurs at
# every start cannot loop. Time-limit requeues are not counted: each one checkpointed progress.
requeue_after_crash() {
    local _fc_count_file="$_fc_run_dir/state/crash_requeues" _fc_crashes=0
    [[ -f $_fc_count_file ]] && _fc_crashes=$(<"$_fc_count_file")
    [[ $_fc_crashes =~ ^[0-9]+$ ]] || _fc_crashes=0
    if (( 10#$_fc_crashes >= 3 )); then
        log "error: $1, and this run was already requeued ${_fc_crashes} time(s) after a crash (slurm.max_requeues=3): not requeueing it; 'flux-cluster runs requeue' resumes it from its last checkpoint"
        exit 1
    fi
    echo "$((10#$_fc_crashes + 1))" > "$_fc_count_file"
    requeue_job "$1 (crash requeue $((10#$_fc_crashes + 1)) of at most 3)"
}

# A trapped signal interrupts 'wait'; keep waiting until the step has really ended.
wait_step() {
    local _fc_pid=$1 _fc_rc=0
    while :; do
        if wait "$_fc_pid"; then return 0; else _fc_rc=$?; fi
        kill -0 "$_fc_pid" 2>/dev/null || return "$_fc_rc"
    done
}

log "checking the data root ${FLUX_DATA_DIR} on every node"
if ! on_nodes test -d "$FLUX_DATA_DIR" -a -r "$FLUX_DATA_DIR" -a -x "$FLUX_DATA_DIR"; then
    log "error: the data root ${FLUX_DATA_DIR} is not mounted or not readable on every node"
    exit 1
fi

run_experiment() {
    local _fc_rc=0
    begin_experiment "$1"
    log "all_reduce bandwidth test across all ranks"
    if ! on_ranks python -m flux_cluster.jobs.preflight --config "$_fc_config" --comm-only; then
        log "error: the all_reduce test failed: not starting experiment ${FLUX_EXP_INDEX}"
        return 1
    fi
    on_ranks python -m flux_cluster.jobs.train --config "$_fc_config" &
    wait_step $! || _fc_rc=$?
    if [[ -e "$FLUX_REQUEUE_MARKER" ]]; then
        rm -f "$FLUX_REQUEUE_MARKER"
        requeue_job "the ranks checkpointed after SIGUSR1"
    fi
    # srun exits with its tasks' highest code, 128+N for a rank that died of signal N (a node crash, the
    # OOM killer, SIGKILL; docker exec reports it so too). That rank wrote no checkpoint: the job resumes
    # from the last periodic one. An error (exit 1) or a missed target (exit 3) would recur: they fail it.
    if (( _fc_rc > 128 && _fc_rc <= 192 )); then
        requeue_after_crash "a rank was killed by a signal (srun exit code ${_fc_rc}: signal $((_fc_rc - 128)))"
    fi
    if (( _fc_rc == 3 )); then
        log "experiment ${FLUX_EXP_INDEX} ended without reaching the quality target (exit code 3)"
        return "$_fc_rc"
    fi
    (( _fc_rc == 0 )) || { log "experiment ${FLUX_EXP_INDEX} failed with exit code ${_fc_rc}"; return "$_fc_rc"; }
    # the official checker; prints the one compliance line (passed / NON-CONFORMING: reasons / error)
    on_one python -m flux_cluster.jobs.compliance --ruleset 6.1.0 \
        --log-output "$_fc_results_dir/compliance_${FLUX_EXP_INDEX}.log" "$FLUX_RESULT_LOG" || return 1
    end_experiment
}

_fc_status=0
for ((_fc_exp = 0; _fc_exp < 1; _fc_exp++)); do
    if [[ -e "$_fc_run_dir/state/exp_${_fc_exp}.done" ]]; then
        log "experiment ${_fc_exp} already finished before a requeue, skipping"
        continue
    fi
    run_experiment "$_fc_exp" || _fc_status=$?
done
exit "$_fc_status"
