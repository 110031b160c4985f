#!/bin/bash
#SBATCH --job-name=flux-data-convert-mi300x8
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=04:00:00
#SBATCH --output=/runs/data-convert/20260101-000000-mi300x8/slurm/%A_%a_0_log.out
#SBATCH --error=/runs/data-convert/20260101-000000-mi300x8/slurm/%A_%a_0_log.err
#SBATCH --open-mode=append
#SBATCH --cpus-per-task=8
#SBATCH --export=ALL,HF_TOKEN=
#SBATCH --no-requeue
#SBATCH --array=0-7
#SBATCH --dependency=afterok:1000
#SBATCH --kill-on-invalid-dep=yes
#
# flux-cluster 0.1.0: the data-convert job on system mi300x8, rendered from
# slurm/templates/sbatch.sh.j2. Change the system config (or use --set) and render again rather than
# editing this file. Launch: one srun task per GPU (NVIDIA's run.sub convention), so Slurm places every
# rank; the time-limit signal reaches this shell, which relays it to the ranks in the containers.
# shellcheck disable=SC2317  # not every job calls every helper function below
set -euo pipefail
# ---- run settings (rendered by flux-cluster; every value is shell-quoted)
# As run.sub names them: NEXP=8, SEED_BASE=0.
_fc_run_dir=/runs/data-convert/20260101-000000-mi300x8
_fc_config=/runs/data-convert/20260101-000000-mi300x8/config.yaml
_fc_results_dir=/runs/data-convert/20260101-000000-mi300x8/results
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
    export FLUX_SEED=$((0 + FLUX_EXP_INDEX))
    export FLUX_RESULT_LOG="$_fc_results_dir/result_${FLUX_EXP_INDEX}.txt"
    export FLUX_CACHE_CLEARED=0
    log "data-convert task $((FLUX_EXP_INDEX + 1)) of 8"
}

end_experiment() {
    touch "$_fc_run_dir/state/exp_${FLUX_EXP_INDEX}.done"
    log "data-convert task $((FLUX_EXP_INDEX + 1)) of 8 finished"
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
    else  # the job asked for no GPUs by GRES (a CPU stage, slurm.gres_gpus false): every GPU of the node
        unset ROCR_VISIBLE_DEVICES
    fi
}
# shellcheck disable=SC2016  # "$@" is expanded by the bash on each node
on_hosts bash -c "$(declare -f _fc_own_gpus)"'; _fc_own_gpus && exec "$@"' own_gpus "$_fc_runtime" run --detach --rm --name="$_fc_container_name" \
    --env=ROCR_VISIBLE_DEVICES --device=/dev/kfd --device=/dev/dri \
    --ipc=host --network=host --ulimit=memlock=-1 --ulimit=stack=67108864 \
    --volume=/mnt/mlperf/flux1/energon:/data \
    --volume=/mnt/mlperf/flux1/download:/source \
    --volume=/runs/data-convert/20260101-000000-mi300x8:/runs/data-convert/20260101-000000-mi300x8 \
    --shm-size=64g \
    --cap-add=SYS_PTRACE \
    --security-opt=seccomp=unconfined \
    --group-add=video \
    --workdir=/workspace/flux-cluster "$_fc_container_image" sleep infinity
on_ranks() { srun --ntasks-per-node=1 --kill-on-bad-exit=1 "$_fc_runtime" exec "${_fc_exec_env[@]}" "$_fc_container_name" "$@"; }
on_nodes() { srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 "$_fc_runtime" exec "${_fc_exec_env[@]}" "$_fc_container_name" "$@"; }
on_one() { srun --ntasks=1 --nodes=1 "$_fc_runtime" exec "${_fc_exec_env[@]}" "$_fc_container_name" "$@"; }
# Slurm signals this batch shell (--signal=B:USR1): relay it to the registered ranks in every container.
relay_signal() {
    log "SIGUSR1: relaying it to the ranks"
    srun --overlap --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 "$_fc_runtime" exec --env=FLUX_PID_DIR \
        "$_fc_container_name" python -m flux_cluster.jobs.signals relay || log "warning: the relay failed"
}
trap relay_signal USR1

# A trapped signal interrupts 'wait'; keep waiting until the step has really ended.
wait_step() {
    local _fc_pid=$1 _fc_rc=0
    while :; do
        if wait "$_fc_pid"; then return 0; else _fc_rc=$?; fi
        kill -0 "$_fc_pid" 2>/dev/null || return "$_fc_rc"
    done
}


run_experiment() {
    local _fc_rc=0
    begin_experiment "$1"
    on_ranks python -m flux_cluster.jobs.data --config "$_fc_config" --stage convert &
    wait_step $! || _fc_rc=$?
    if [[ -e "$FLUX_REQUEUE_MARKER" ]]; then
        rm -f "$FLUX_REQUEUE_MARKER"
        log "the ranks checkpointed after SIGUSR1; requeue is off for this system, stopping"
        return 1
    fi
    (( _fc_rc == 0 )) || { log "experiment ${FLUX_EXP_INDEX} failed with exit code ${_fc_rc}"; return "$_fc_rc"; }
    end_experiment
}

run_experiment "$SLURM_ARRAY_TASK_ID"
