"""Reading files we do not control (run folders, checkpoints, result logs, user data), with bounds.

Every read here opens without following a final symlink and without blocking on a FIFO, checks the
*opened* file (fstat: a regular file, inside the folder it must be in), and never reads more than a
stated number of bytes. JSON from such files fails as one ``OutsideFileError`` line, never as a
RecursionError or ValueError traceback (deep nesting, 4,300+-digit numbers).
"""

import json
import math
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from flux_cluster.errors import FluxClusterError

KIB = 1024
MIB = 1024 * KIB
# A JSON state file of ours (jobs.json, a manifest, a spec) is a few KiB; metadata files can be larger.
SMALL_JSON = 4 * MIB
LINE_LIMIT = 1 * MIB
"""The longest line kept whole where text is handled a line at a time (a job log's labelled lines)."""
MAX_COUNT = 2**53
"""Counts (samples, nodes) above this are not exact as floats: no real file has them."""


class OutsideFileError(FluxClusterError, ValueError):
    """A file from outside was missing, not a regular file, outside its folder, too big or malformed."""


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except (ValueError, OSError, RuntimeError):
        return False
    return True


@contextmanager
def open_regular(
    path: str | os.PathLike[str], inside: str | os.PathLike[str] | None = None
) -> Iterator[IO[bytes]]:
    """path opened for binary reading, once it is a regular file (not a symlink, FIFO or device) that
    lies inside ``inside`` when given. The checks are on the opened descriptor, so swapping the path
    for a symlink after a scan does not get an outside file read."""
    path = Path(path)
    if inside is not None and not _inside(path.parent, Path(inside)):
        raise OutsideFileError(f"{path}: outside {inside}; refused")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise OutsideFileError(f"{path}: no such file") from None
    except OSError as exc:
        if os.path.islink(path):
            raise OutsideFileError(
                f"{path}: a symbolic link; refused (only regular files are read)"
            ) from None
        raise OutsideFileError(f"{path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OutsideFileError(f"{path}: not a regular file; refused")
        opened = Path(f"/proc/self/fd/{fd}") if Path("/proc/self/fd").is_dir() else path
        if inside is not None and not _inside(opened, Path(inside)):
            raise OutsideFileError(f"{path}: outside {inside}; refused")
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle


def read_bounded(
    path: str | os.PathLike[str], limit: int, inside: str | os.PathLike[str] | None = None, what: str = "file"
) -> bytes:
    """The whole of a regular file of at most limit bytes; a bigger one is one line naming the limit."""
    with open_regular(path, inside) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise OutsideFileError(f"{path}: {what} is over {_size(limit)}; refused")
    return data


def read_tail(
    path: str | os.PathLike[str], limit: int, inside: str | os.PathLike[str] | None = None
) -> bytes:
    """The last limit bytes of a regular file (all of it when smaller)."""
    with open_regular(path, inside) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            handle.seek(size - limit)
        return handle.read(limit)


def parse_json(text: str | bytes, where: str | os.PathLike[str]) -> Any:
    """json.loads that fails as one OutsideFileError line naming where (deep nesting and huge numbers
    included)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise OutsideFileError(f"{where}: JSON nested too deeply; refused") from None
    except (ValueError, UnicodeDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise OutsideFileError(f"{where}: not valid JSON ({reason})") from None


def read_json(
    path: str | os.PathLike[str], limit: int = SMALL_JSON, inside: str | os.PathLike[str] | None = None
) -> Any:
    """A bounded regular JSON file, parsed; every failure is one OutsideFileError line."""
    return parse_json(read_bounded(path, limit, inside, what="JSON file"), path)


def read_json_object(
    path: str | os.PathLike[str], limit: int = SMALL_JSON, inside: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """read_json for a file that must hold a JSON object."""
    data = read_json(path, limit, inside)
    if not isinstance(data, dict):
        raise OutsideFileError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _size(limit: int) -> str:
    if limit >= MIB and limit % MIB == 0:
        return f"{limit // MIB} MiB"
    return f"{limit // KIB} KiB" if limit >= KIB and limit % KIB == 0 else f"{limit} bytes"


def finite_number(value: Any) -> bool:
    """A JSON/YAML number usable as a float: not bool, not NaN or infinite, no int past float range."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) <= 1 << 1023  # math.isfinite would raise OverflowError beyond
    return isinstance(value, float) and math.isfinite(value)


def non_negative(value: Any) -> float | None:
    """value as a float if it is a finite number >= 0, else None."""
    return float(value) if finite_number(value) and value >= 0 else None


def whole_number(value: Any, low: int = 0, high: int = MAX_COUNT) -> int | None:
    """value as an int if it is a whole number from low to high (262144.0 counts as 262144), else None."""
    if not finite_number(value) or not low <= value <= high or value != int(value):
        return None
    return int(value)
