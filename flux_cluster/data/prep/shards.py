"""Writing and reading the webdataset shards: deterministic tar bytes, atomic completion, records.

A shard is written under a hidden temporary name and renamed when complete, then its record (samples,
bytes, sha256) is written: a shard without a record is unfinished and is converted again. The tar
headers come from the standard library; payloads are written straight from the Arrow buffers.
"""

import fcntl
import hashlib
import json
import os
import socket
import tarfile
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO

from flux_cluster.atomic import write_atomic
from flux_cluster.data.format import SHARD_PATTERN, Split
from flux_cluster.errors import write_error

STATE_DIR = ".flux-prep"
"""Under the Energon root: the conversion plan and one record per finished shard."""
_BLOCK = tarfile.BLOCKSIZE


class ShardWriter:
    """A USTAR archive with fixed metadata (mtime 0, root owner, mode 0444): equal input, equal bytes."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._hash = hashlib.sha256()
        self.nbytes = 0

    def add(self, name: str, payload: bytes | memoryview) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(payload)
        info.mtime = 0
        info.mode = 0o444
        info.uname = info.gname = ""
        self._write(info.tobuf(format=tarfile.USTAR_FORMAT))
        self._write(payload)
        remainder = len(payload) % _BLOCK
        if remainder:
            self._write(bytes(_BLOCK - remainder))

    def close(self) -> None:
        self._write(bytes(2 * _BLOCK))  # end-of-archive marker
        remainder = self.nbytes % tarfile.RECORDSIZE
        if remainder:
            self._write(bytes(tarfile.RECORDSIZE - remainder))

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def _write(self, data: bytes | memoryview) -> None:
        self._stream.write(data)
        self._hash.update(data)
        self.nbytes += len(data)


@dataclass
class ShardRecord:
    """What conversion recorded for one finished shard."""

    split: str
    shard: int
    samples: int
    first_sample: int
    nbytes: int
    sha256: str
    timesteps: dict[str, int] = field(default_factory=dict)
    """Val: samples per timestep."""

    @staticmethod
    def path(root: Path, split: Split, shard: int) -> Path:
        return root / STATE_DIR / split / (SHARD_PATTERN.format(shard) + ".json")

    def save(self, root: Path) -> None:
        path = self.path(root, self.split, self.shard)  # type: ignore[arg-type]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, root: Path, split: Split, shard: int) -> "ShardRecord | None":
        path = cls.path(root, split, shard)
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, RecursionError):
            return None  # a damaged record: the shard is simply converted again


def shard_path(root: Path, split: Split, shard: int) -> Path:
    return root / split / SHARD_PATTERN.format(shard)


def is_finished(root: Path, split: Split, shard: int) -> bool:
    record = ShardRecord.load(root, split, shard)
    if record is None:
        return False
    try:
        return shard_path(root, split, shard).stat().st_size == record.nbytes
    except FileNotFoundError:
        return False


def shard_lock(root: Path, split: Split, shard: int) -> AbstractContextManager[None]:
    """Hold the shard's lock file: one writer per shard across tasks and runs."""
    return output_lock(root, f"{split}/{SHARD_PATTERN.format(shard)}")


@contextmanager
def output_lock(root: Path, name: str) -> Iterator[None]:
    """Hold the lock file STATE_DIR/<name>.lock of an output (flock: released by the kernel when a
    holder dies); a second holder waits."""
    path = root / STATE_DIR / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_shard(
    root: Path,
    split: Split,
    shard: int,
    first_sample: int,
    members: Iterator[tuple[str, bytes | memoryview]],
    timesteps: Counter[int] | None = None,
) -> ShardRecord:
    """Write the shard atomically and record it (``timesteps``: filled by the members iterator).
    The caller holds the shard's lock, so any partial file of this shard is left by a killed attempt."""
    final = shard_path(root, split, shard)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}.partial-*"):
        stale.unlink(missing_ok=True)
    temporary = final.parent / f".{final.name}.partial-{socket.gethostname()}-{os.getpid()}"
    names: set[str] = set()
    try:
        with open(temporary, "wb") as stream:
            writer = ShardWriter(stream)
            for name, payload in members:
                writer.add(name, payload)
                names.add(name.split(".", 1)[0])
            writer.close()
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, final)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise write_error(temporary, exc) from None  # e.g. a full disk
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    record = ShardRecord(
        split=split,
        shard=shard,
        samples=len(names),
        first_sample=first_sample,
        nbytes=writer.nbytes,
        sha256=writer.sha256,
        timesteps={str(k): v for k, v in sorted((timesteps or Counter()).items())},
    )
    record.save(root)
    return record
