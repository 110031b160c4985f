"""Sharded training checkpoints with torch.distributed.checkpoint (DCP), committed atomically.

A checkpoint is the folder ``step_XXXXXXXX`` holding DCP's shards of the model and optimizer (each rank
writes its own shards, no full copy anywhere), ``rank_NNNNN.pt`` with each rank's RNG and loader
state, ``train_state.json`` (step, samples, scheduler, eval history) and ``manifest.json``: every file's
size and sha256, written last (atomically) as the commit mark. Every rank writes into
``.step_XXXXXXXX.partial`` and hashes its own files; after all have finished, rank 0 writes the manifest
and renames the folder. A job killed mid-save leaves only a partial folder, which is never read and is
removed by the next save. Before a resume the ranks check the newest checkpoints against their
manifests (sizes everywhere, each rank hashing a share of the files) and agree on the newest intact one;
a damaged one is set aside as ``.step_XXXXXXXX.rejected`` with one line saying why, and the next older
one is tried. The folder must be on a file system every rank sees (the run directory).
"""

import errno
import hashlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from flux_cluster.atomic import write_atomic
from flux_cluster.errors import full_disk, write_error

STATE_FILE = "train_state.json"
MANIFEST = "manifest.json"
_PREFIX = "step_"
_PARTIAL = ".partial"
_REJECTED = ".rejected"


class CheckpointError(RuntimeError):
    """A checkpoint that is intact but cannot be used by this job (another world size)."""


class CheckpointSaveError(SystemExit):
    """A save failed (a full disk): the job ends with one line from rank 0 (the others exit 1, silent).
    Nothing of the failed save is left; the last committed checkpoint is untouched."""


_FULL_BELOW = 64 << 20
"""Free bytes under which a failed write is taken for a full disk (torch's file writer drops the errno)."""


def _save_error(final: Path, exc: BaseException) -> str:
    """One line for a save that failed with exc (DCP's CheckpointException holds each rank's error)."""
    causes = list(exc.failures.values()) if isinstance(exc, CheckpointException) else [exc]
    cause = causes[0][0] if isinstance(causes[0], tuple) else causes[0]  # (error, its stack summary)
    if not full_disk(cause):
        try:
            stat = os.statvfs(final.parent)
            if stat.f_bavail * stat.f_frsize < _FULL_BELOW:
                cause = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            pass
    return str(write_error(final, cause))


def _all_gather(value: Any) -> list[Any]:
    """Every rank's value, in rank order (just this one outside a process group)."""
    if not dist.is_initialized():
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def from_rank0(value: Any) -> Any:
    """Rank 0's value on every rank (a collective)."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _describe(path: Path) -> dict[str, Any]:
    return {"size": path.stat().st_size, "sha256": _sha256(path)}


def step_of(path: Path) -> int:
    return int(path.name.removeprefix(_PREFIX))


class Checkpointer:
    def __init__(self, folder: Path, keep: int, rank: int, world_size: int, frozen_base: bool = False):
        self.folder = folder
        self.keep = keep
        self.rank = rank
        self.world_size = world_size
        self.options = StateDictOptions(ignore_frozen_params=frozen_base, strict=not frozen_base)
        """LoRA: the frozen base comes from the pretrained weights again; only adapters are saved."""

    def committed(self) -> list[Path]:
        """Checkpoint folders (renamed from partial, not yet checked against their manifest), oldest first."""
        if not self.folder.is_dir():
            return []
        found = [
            p
            for p in self.folder.iterdir()
            if p.name.startswith(_PREFIX) and p.name.removeprefix(_PREFIX).isdigit() and p.is_dir()
        ]
        return sorted(found, key=step_of)

    def latest(self) -> Path | None:
        done = self.committed()
        return done[-1] if done else None

    def choose(self) -> tuple[Path | None, list[str]]:
        """Collective: the newest checkpoint that matches its manifest, agreed by all ranks, and one line
        per newer one that was skipped (set aside as .step_XXXXXXXX.rejected by rank 0)."""
        names = from_rank0([p.name for p in reversed(self.committed())] if self.rank == 0 else None)
        skipped = []
        for name in names:
            path = self.folder / name
            problems = [p for p in _all_gather(self._problem(path)) if p]
            if not problems:
                return path, skipped
            aside = path.with_name(f".{name}{_REJECTED}")
            if self.rank == 0:
                shutil.rmtree(aside, ignore_errors=True)
                os.rename(path, aside)
            skipped.append(f"checkpoint {path} skipped (kept as {aside.name}): {problems[0]}")
        return None, skipped

    def _problem(self, path: Path) -> str | None:
        """Why this checkpoint cannot be trusted, or None. Sizes are checked by every rank, sha256 sums
        by each rank for its share of the files."""
        try:
            files = json.loads((path / MANIFEST).read_text())["files"]
            entries = sorted((str(name), int(e["size"]), str(e["sha256"])) for name, e in files.items())
        except FileNotFoundError:
            return f"no {MANIFEST}: its save never finished"
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return f"{MANIFEST} is unreadable ({type(exc).__name__}: {exc})"
        for name, size, _ in entries:
            try:
                found = (path / name).stat().st_size
            except OSError:
                return f"{name} is missing"
            if found != size:
                return f"{name} has {found} bytes, the manifest says {size}"
        for name, _, sha256 in entries[self.rank :: self.world_size]:
            try:
                if _sha256(path / name) != sha256:
                    return f"{name} does not match its sha256 in the manifest"
            except OSError as exc:
                return f"{name} is unreadable ({exc.strerror})"
        return None

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
        error = None
        if self.rank == 0:
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(partial, ignore_errors=True)  # left by a save that was killed
                partial.mkdir()
            except OSError as exc:
                error = _save_error(final, exc)
        self._stop_if_failed(_all_gather(error), partial)
        model_state, optim_state = get_state_dict(model, optimizer, options=self.options)
        mine: dict[str, Any] = {}
        try:
            # Collective: a write that fails on any rank raises CheckpointException on every rank.
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=partial)
            buffer = io.BytesIO()
            torch.save(per_rank, buffer)
            rank_file = partial / f"rank_{self.rank:05d}.pt"
            write_atomic(rank_file, buffer.getvalue())
            # Each rank hashes what it wrote (DCP names its shards __<rank>_<n>.distcp); rank 0 the rest.
            mine = {p.name: _describe(p) for p in [rank_file, *partial.glob(f"__{self.rank}_*.distcp")]}
        except (CheckpointException, OSError) as exc:
            error = _save_error(final, exc)
        gathered = _all_gather((error, mine))
        self._stop_if_failed([failure for failure, _ in gathered], partial)
        if self.rank == 0:
            try:
                document = {**shared, "step": step, "world_size": self.world_size}
                write_atomic(partial / STATE_FILE, json.dumps(document, indent=1) + "\n")
                files = {name: entry for _, part in gathered for name, entry in part.items()}
                for path in partial.iterdir():
                    if path.name not in files and path.is_file():
                        files[path.name] = _describe(path)
                manifest = {"step": step, "world_size": self.world_size, "files": dict(sorted(files.items()))}
                write_atomic(partial / MANIFEST, json.dumps(manifest, indent=1) + "\n")
                if final.exists():  # the same step saved again after a restart
                    shutil.rmtree(final)
                os.rename(partial, final)
                _fsync_dir(self.folder)
                self._prune()
            except OSError as exc:
                error = _save_error(final, exc)
        self._stop_if_failed([from_rank0(error)], partial)
        return final

    def _stop_if_failed(self, errors: list[str | None], partial: Path) -> None:
        """After a collective step of a save: if any rank failed, all stop with one line (printed by rank
        0), and the partial folder goes, so only committed checkpoints remain."""
        failed = [error for error in errors if error]
        if not failed:
            return
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
        raise CheckpointSaveError(f"error: {failed[0]}" if self.rank == 0 else 1)

    def load(
        self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Restore model and optimizer in place; returns (shared state, this rank's state)."""
        shared = json.loads((path / STATE_FILE).read_text())
        if shared["world_size"] != self.world_size:
            raise CheckpointError(
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
