"""Process-group start-up shared by every job: ranks come from torchrun or from srun (one task per GPU)."""

import atexit
import datetime
import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, NoReturn

from flux_cluster.errors import FluxClusterError
from flux_cluster.rundir import lock_repeat

if TYPE_CHECKING:
    import torch

_SLURM_TO_TORCH = {
    "SLURM_PROCID": "RANK",
    "SLURM_NTASKS": "WORLD_SIZE",
    "SLURM_LOCALID": "LOCAL_RANK",
}


def rank_env_from_slurm(environ: MutableMapping[str, str]) -> None:
    """Fill torch's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE from an srun task's variables.

    torchrun already sets them; the sbatch script exports MASTER_ADDR and MASTER_PORT.
    """
    if "RANK" in environ or "SLURM_PROCID" not in environ:
        return
    for slurm_name, torch_name in _SLURM_TO_TORCH.items():
        environ[torch_name] = environ[slurm_name]
    per_node = environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0].split(",")[0]
    environ["LOCAL_WORLD_SIZE"] = per_node


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: "torch.device"


def choose_backend(preference: str, cuda_available: bool) -> str:
    if preference != "auto":
        return preference
    return "nccl" if cuda_available else "gloo"  # RCCL answers to "nccl" on ROCm builds


def init_distributed(preference: str = "auto", timeout_s: int = 600) -> DistInfo:
    """Join the process group (env:// rendezvous) and pick this rank's device."""
    import torch
    import torch.distributed as dist

    env = os.environ
    rank_env_from_slurm(env)
    backend = choose_backend(preference, torch.cuda.is_available())
    local_rank = int(env.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, backend, device)


def lock_repeat_on_rank0(run_dir: Path, exp_index: int, rank: int) -> IO[str] | None:
    """Rank 0 locks this repeat of the run, so an attempt whose ranks outlived their launcher and a new one
    never write it (or its checkpoints) at once; every rank learns whether it could: another holder is the
    same one-line FluxClusterError on every rank. Rank 0 returns the lock (held while it stays open)."""
    import torch.distributed as dist

    lock, refused = None, None
    if rank == 0:
        try:
            lock = lock_repeat(run_dir, exp_index)
        except FluxClusterError as exc:
            refused = str(exc)
    verdict = [refused]
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise FluxClusterError(verdict[0])
    return lock


def refusal(rank: int, line: object) -> SystemExit:
    """A refusal every rank meets alike (a bad batch, a damaged folder, a held lock): its one line from
    rank 0, the other ranks end with exit 1 and say nothing."""
    return SystemExit(line if rank == 0 else 1)


def exit_rank(code: int) -> NoReturn:
    """End a rank whose job is done: run the exit handlers (log files, loader workers), flush, and leave
    without interpreter finalization.

    torch's DTensor caches (MeshTopoInfo, the redistribute planner, sharding propagation) keep every
    mesh's process groups alive past ``destroy_process_group()``, so their gloo threads are still running
    when the interpreter tears down; destroying them there can abort a rank that finished its work
    ("terminate called without an active exception"), and srun then fails a successful step.
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
