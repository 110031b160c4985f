"""Sharded training checkpoints with torch.distributed.checkpoint (DCP), committed atomically.

A checkpoint is the folder ``step_XXXXXXXX`` holding DCP's shards of the model and optimizer (each rank
writes its own shards, no full copy anywhere), ``rank_NNNNN.pt`` with each rank's RNG and loader
state, and ``train_state.json`` (step, samples, scheduler, eval history). Every rank writes into
``.step_XXXXXXXX.partial``; after all have finished, rank 0 renames it. A job killed mid-save leaves
only a partial folder, which is never read and is removed by the next save, so the last committed
checkpoint always survives. The folder must be on a file system every rank sees (the run directory).
"""

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

STATE_FILE = "train_state.json"
_PREFIX = "step_"
_PARTIAL = ".partial"


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpointer:
    def __init__(self, folder: Path, keep: int, rank: int, world_size: int, frozen_base: bool = False):
        self.folder = folder
        self.keep = keep
        self.rank = rank
        self.world_size = world_size
        self.options = StateDictOptions(ignore_frozen_params=frozen_base, strict=not frozen_base)
        """LoRA: the frozen base comes from the pretrained weights again; only adapters are saved."""

    def committed(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.folder.is_dir():
            return []
        found = [p for p in self.folder.iterdir() if p.name.startswith(_PREFIX) and p.is_dir()]
        return sorted(found, key=lambda p: int(p.name.removeprefix(_PREFIX)))

    def latest(self) -> Path | None:
        done = self.committed()
        return done[-1] if done else None

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        shared: dict[str, Any],
        per_rank: dict[str, Any],
    ) -> Path:
        """Collective: every rank calls it with its own per_rank state; returns the committed folder."""
        final = self.folder / f"{_PREFIX}{step:08d}"
        partial = self.folder / f".{final.name}{_PARTIAL}"
        if self.rank == 0:
            self.folder.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)  # left by a save that was killed
            partial.mkdir()
        _barrier()
        model_state, optim_state = get_state_dict(model, optimizer, options=self.options)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=partial)
        torch.save(per_rank, partial / f"rank_{self.rank:05d}.pt")
        _barrier()
        if self.rank == 0:
            document = {**shared, "step": step, "world_size": self.world_size}
            (partial / STATE_FILE).write_text(json.dumps(document, indent=1) + "\n")
            if final.exists():  # the same step saved again after a restart
                shutil.rmtree(final)
            os.rename(partial, final)
            _fsync_dir(self.folder)
            self._prune()
        _barrier()
        return final

    def load(
        self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Restore model and optimizer in place; returns (shared state, this rank's state)."""
        shared = json.loads((path / STATE_FILE).read_text())
        if shared["world_size"] != self.world_size:
            raise RuntimeError(
                f"{path} was written by {shared['world_size']} ranks; this job has {self.world_size}. "
                "Resume with the same nodes and GPUs per node."
            )
        model_state, optim_state = get_state_dict(model, optimizer, options=self.options)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=self.options,
        )
        per_rank = torch.load(path / f"rank_{self.rank:05d}.pt", weights_only=False)
        return shared, per_rank

    def _prune(self) -> None:
        for old in self.committed()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.folder.glob(f".{_PREFIX}*{_PARTIAL}"):
            shutil.rmtree(stale, ignore_errors=True)
