#!/bin/bash
#SBATCH --job-name=flux-throughput-local_slurm
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:30:00
#SBATCH --output=/runs/sweep-mbs/arrays/20260101-000000-nodes1/slurm/%A_%a_0_log.out
#SBATCH --error=/runs/sweep-mbs/arrays/20260101-000000-nodes1/slurm/%A_%a_0_log.err
#SBATCH --open-mode=append
#SBATCH --partition=debug
#SBATCH --cpus-per-task=1
#SBATCH --mem-per-cpu=1000
#SBATCH --export=ALL
#SBATCH --requeue
#SBATCH --signal=USR1@60
#SBATCH --array=0-2%2
#SBATCH --dependency=afterok:1000,afterany:1001
#SBATCH --kill-on-invalid-dep=yes
#
# flux-cluster 0.1.0: sweep sweep-mbs on system local_slurm, its points that ask for the same allocation
# as one array, rendered from slurm/templates/sweep_array.sh.j2. Task i runs point i's own job script (its
# run directory, config and results) as 'sbatch job.sh' would; its Slurm output is linked from the point's
# slurm/ folder.
set -euo pipefail
_fc_points=(
    /runs/sweep-mbs/20260101-000000-p000
    /runs/sweep-mbs/20260101-000000-p001
    /runs/sweep-mbs/20260101-000000-p002
)
# Digits only before the arithmetic: bash would run a '$(...)' inside an array subscript there.
[[ ${SLURM_ARRAY_TASK_ID:-} =~ ^[0-9]+$ ]] || { echo "error: SLURM_ARRAY_TASK_ID '${SLURM_ARRAY_TASK_ID:-}' is not a number" >&2; exit 1; }
_fc_task=$((10#$SLURM_ARRAY_TASK_ID))
(( _fc_task < 3 )) || { echo "error: array task ${_fc_task}: the array has 3 points" >&2; exit 1; }
_fc_point=${_fc_points[_fc_task]}
echo "[flux-cluster] array task ${_fc_task}: ${_fc_point}"
exec bash "$_fc_point/job.sh"
