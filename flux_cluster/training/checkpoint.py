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

Nothing read back runs code: a checkpoint folder is outside data (a crafted one must not act). The
manifest names plain files of the folder only, each a regular file; ``rank_NNNNN.pt`` holds plain data
only (``to_plain``: the loader's state objects as tagged dicts) and is read with
``torch.load(weights_only=True)``; DCP's ``.metadata`` pickle goes through an unpickler that builds only
DCP's metadata classes, and DCP's non-tensor values are read with ``weights_only=True`` too. Checkpoints
written before this format (their rank files pickled the loader's objects) are refused like damaged ones.
"""

import dataclasses
import errno
import functools
import hashlib
import io
import json
import os
import pickle
import shutil
import stat
from collections import OrderedDict
from pathlib import Path, PosixPath, PurePosixPath
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from flux_cluster.atomic import write_atomic
from flux_cluster.errors import full_disk, write_error
from flux_cluster.outside import MIB, OutsideFileError, open_regular, read_bounded, read_json_object
from flux_cluster.safe_text import printable

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
    with open_regular(path, inside=path.parent) as handle:
        while chunk := handle.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _describe(path: Path) -> dict[str, Any]:
    return {"size": path.stat().st_size, "sha256": _sha256(path)}


def step_of(path: Path) -> int:
    return int(path.name.removeprefix(_PREFIX))


_DCP_METADATA = ".metadata"
_MAX_DCP_METADATA = 256 * MIB
_MAX_RANK_STATE = 256 * MIB
_STATE_TAG = "__flux_state__"
"""Key of the dict that stands for a state object in to_plain's output (with "fields")."""


@functools.cache
def _state_classes() -> dict[str, type]:
    """The classes to_plain may store, by name: the Energon loader state's (flux_cluster.data.loader)."""
    from flux_cluster.data.loader import loader_state_classes

    return {cls.__name__: cls for cls in loader_state_classes()}


def to_plain(value: Any) -> Any:
    """value as data torch.load(weights_only=True) reads back: tensors, numbers, strings, bytes, None,
    lists, tuples and dicts; the loader's state objects (and numpy arrays in them) as tagged dicts."""
    if value is None or isinstance(value, bool | int | float | str | bytes | torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        fields = {"dtype": value.dtype.str, "shape": list(value.shape), "data": value.tobytes()}
        return {_STATE_TAG: "ndarray", "fields": fields}
    if isinstance(value, np.generic):
        return value.item()
    name = type(value).__name__
    if _state_classes().get(name) is type(value):
        if dataclasses.is_dataclass(value):
            fields = {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        else:  # FlexState, a dict
            fields = {key: to_plain(item) for key, item in value.items()}
        return {_STATE_TAG: name, "fields": fields}
    if type(value) in (dict, OrderedDict):
        return type(value)((key, to_plain(item)) for key, item in value.items())
    if type(value) in (list, tuple):
        return type(value)(to_plain(item) for item in value)
    raise TypeError(f"checkpoint state holds a {type(value).__qualname__}: not storable as plain data")


def from_plain(value: Any) -> Any:
    """to_plain's inverse: the tagged dicts back into the objects they stand for (only known classes)."""
    if isinstance(value, list | tuple):
        return type(value)(from_plain(item) for item in value)
    if not isinstance(value, dict):
        return value
    if set(value) != {_STATE_TAG, "fields"}:
        return type(value)((key, from_plain(item)) for key, item in value.items())
    name, fields = value[_STATE_TAG], value["fields"]
    if not isinstance(fields, dict):
        raise ValueError(f"state {name!r}: expected its fields as a dict")
    if name == "ndarray":
        dtype = np.dtype(fields["dtype"])
        if dtype.hasobject:
            raise ValueError("an array of Python objects; expected numbers")
        return np.frombuffer(fields["data"], dtype=dtype).reshape(fields["shape"]).copy()
    cls = _state_classes().get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"state {printable(str(name))!r}: not a loader state class")
    items = {key: from_plain(item) for key, item in fields.items()}
    if not dataclasses.is_dataclass(cls):
        return cls(items)
    known = {f.name for f in dataclasses.fields(cls)}
    if set(items) != known:
        raise ValueError(f"state {name}: fields {sorted(items)}, expected {sorted(known)}")
    return cls(**items)


def _read_rank_state(path: Path) -> dict[str, Any]:
    """A rank_NNNNN.pt file: plain data only (weights_only), its state objects rebuilt."""
    data = read_bounded(path, _MAX_RANK_STATE, inside=path.parent, what="rank state")
    try:
        state = from_plain(torch.load(io.BytesIO(data), map_location="cpu", weights_only=True))
    except Exception as exc:  # an UnpicklingError for any pickled object, others for wrong shapes
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise OutsideFileError(
            f"{path.name} is not plain checkpoint data (an older version's, or crafted): {printable(reason)}"
        ) from None
    if not isinstance(state, dict):
        raise OutsideFileError(f"{path.name}: expected a dict of state, found {type(state).__name__}")
    return state


def _allowed_metadata_global(module: str, name: str) -> Any:
    """What DCP's .metadata pickle may name: DCP's metadata classes and the torch values inside them."""
    if module == dcp_metadata.__name__:
        found = getattr(dcp_metadata, name, None)
        if isinstance(found, type) and found.__module__ == module:
            return found
    elif module == "torch" and name == "Size":
        return torch.Size
    elif module == "torch":
        found = getattr(torch, name, None)
        if isinstance(found, torch.dtype | torch.layout | torch.memory_format):
            return found
    else:
        allowed = {
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
            ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
            ("pathlib", "PosixPath"): PosixPath,
            ("pathlib", "PurePosixPath"): PurePosixPath,
            ("collections", "OrderedDict"): OrderedDict,
        }
        if (module, name) in allowed:
            return allowed[(module, name)]
    raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP metadata; refused")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _allowed_metadata_global(module, name)


def _read_dcp_metadata(path: Path, shards: set[str]) -> dcp_metadata.Metadata:
    """DCP's .metadata, unpickled with only DCP's metadata classes; every shard it names must be one of
    shards (the files the manifest lists)."""
    data = read_bounded(path, _MAX_DCP_METADATA, inside=path.parent, what="DCP metadata")
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # pickle raises many kinds on a damaged or crafted file
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise OutsideFileError(f"{path.name} is not DCP metadata ({printable(reason)})") from None
    if not isinstance(metadata, dcp_metadata.Metadata) or not isinstance(metadata.storage_data, dict):
        raise OutsideFileError(f"{path.name} is not DCP metadata (found {type(metadata).__name__})")
    for info in metadata.storage_data.values():
        where = getattr(info, "relative_path", None)
        if not isinstance(info, _StorageInfo) or where not in shards:
            raise OutsideFileError(
                f"{path.name} names the shard {printable(str(where))!r}, not a file of the manifest"
            )
    return metadata


class _SafeReader(FileSystemReader):
    """DCP's file reader, its metadata read by _read_dcp_metadata instead of pickle.load."""

    def __init__(self, path: Path, shards: set[str]) -> None:
        super().__init__(path)
        self.folder, self.shards = path, shards

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        metadata = _read_dcp_metadata(self.folder / _DCP_METADATA, self.shards)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner, its non-tensor values (optimizer settings) read with weights_only."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def _plain_name(name: Any) -> bool:
    """A file name of the checkpoint folder itself: no folder part, no '..', nothing odd."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= 255
        and name not in (".", "..")
        and not any(c in name for c in "/\\\0")
    )


def _manifest(path: Path) -> dict[str, tuple[int, str]]:
    """The manifest's files (name -> size, sha256); OutsideFileError naming what is wrong."""
    document = read_json_object(path / MANIFEST, inside=path)
    files = document.get("files")
    if not isinstance(files, dict):
        raise OutsideFileError(f"{MANIFEST}: expected 'files', an object of file name to size and sha256")
    entries = {}
    for name, entry in files.items():
        if not _plain_name(name):
            raise OutsideFileError(
                f"{MANIFEST} names {printable(str(name))!r}: expected a file name in the checkpoint folder"
            )
        size = entry.get("size") if isinstance(entry, dict) else None
        sha256 = entry.get("sha256") if isinstance(entry, dict) else None
        if type(size) is not int or size < 0 or not isinstance(sha256, str) or len(sha256) != 64:
            raise OutsideFileError(f"{MANIFEST}: {printable(name)}: expected a size and a sha256")
        entries[name] = (size, sha256)
    for needed in (_DCP_METADATA, STATE_FILE):
        if needed not in entries:
            raise OutsideFileError(f"{MANIFEST} does not list {needed}")
    return entries


class Checkpointer:
    def __init__(self, folder: Path, keep: int, rank: int, world_size: int, frozen_base: bool = False):
        self.folder = folder
        self.keep = keep
        self.rank = rank
        self.world_size = world_size
        self.options = StateDictOptions(ignore_frozen_params=frozen_base, strict=not frozen_base)
        """LoRA: the frozen base comes from the pretrained weights again; only adapters are saved."""
        self._checked: dict[Path, tuple[set[str], dict[str, Any] | None]] = {}
        """Per checkpoint _problem passed: its manifest's files and this rank's state, read once."""

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
        by each rank for its share of the files; then each rank reads its own state and DCP's metadata
        as safe data."""
        try:
            return self._check(path)
        except OutsideFileError as exc:
            return str(exc)
        except Exception as exc:  # whatever a crafted folder provokes: it is skipped, never fatal
            reason = (str(exc).strip().splitlines() or [""])[0][:200]
            return f"cannot be checked ({type(exc).__name__}: {printable(reason)})"

    def _check(self, path: Path) -> str | None:
        if not os.path.lexists(path / MANIFEST):
            return f"no {MANIFEST}: its save never finished"
        try:
            files = _manifest(path)
        except OutsideFileError as exc:
            return f"{MANIFEST} is unreadable ({exc})"
        entries = sorted((name, size, sha256) for name, (size, sha256) in files.items())
        for name, size, _ in entries:
            try:
                info = os.lstat(path / name)
            except OSError:
                return f"{name} is missing"
            if not stat.S_ISREG(info.st_mode):
                return f"{printable(name)} is not a regular file"
            if info.st_size != size:
                return f"{name} has {info.st_size} bytes, the manifest says {size}"
        for name, _, sha256 in entries[self.rank :: self.world_size]:
            try:
                if _sha256(path / name) != sha256:
                    return f"{name} does not match its sha256 in the manifest"
            except OSError as exc:
                return f"{name} is unreadable ({exc.strerror})"
        _read_dcp_metadata(path / _DCP_METADATA, set(files))
        mine = f"rank_{self.rank:05d}.pt"
        state = _read_rank_state(path / mine) if mine in files else None  # none: another world size
        self._checked[path] = (set(files), state)
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
            torch.save(to_plain(per_rank), buffer)
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
        shared = read_json_object(path / STATE_FILE, inside=path)
        if shared.get("world_size") != self.world_size:
            raise CheckpointError(
                f"{path} was written by {shared['world_size']} ranks; this job has {self.world_size}. "
                "Resume with the same nodes and GPUs per node."
            )
        model_state, optim_state = get_state_dict(model, optimizer, options=self.options)
        state = {"model": model_state, "optim": optim_state}
        shards, per_rank = self._checked.pop(path, None) or (set(_manifest(path)), None)
        dcp.load(state, storage_reader=_SafeReader(path, shards), planner=_SafePlanner())
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=self.options,
        )
        if per_rank is None:
            per_rank = _read_rank_state(path / f"rank_{self.rank:05d}.pt")
        return shared, per_rank

    def _prune(self) -> None:
        for old in self.committed()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.folder.glob(f".{_PREFIX}*{_PARTIAL}"):
            shutil.rmtree(stale, ignore_errors=True)
