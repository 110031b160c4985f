"""The one exception type that reaches users as a single clean line (no traceback)."""

import errno
import os
from collections.abc import Iterator

_FULL = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
_SQLITE_FULL = 13  # sqlite3.Error.sqlite_errorcode of "database or disk is full"


class FluxClusterError(Exception):
    """A user-facing error: the message names the file, the key and what was expected."""


class NoResultsError(FluxClusterError):
    """A report found no result logs under its paths (the CLI's exit code 1, not a usage error)."""


def first_line(exc: BaseException) -> str:
    """A library's error as one line for ours: its message's first line (printable, at most 200
    characters), else its type."""
    from flux_cluster.safe_text import printable

    return printable((str(exc).strip().splitlines() or [type(exc).__name__])[0][:200])


def causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def full_disk(exc: BaseException) -> str | None:
    """'no space left on device' (or the quota's line) when a full disk is behind exc, anywhere in its
    chain of causes (libraries wrap the OSError), else None."""
    for cause in causes(exc):
        if isinstance(cause, OSError) and cause.errno in _FULL:
            return _FULL[cause.errno]
        if getattr(cause, "sqlite_errorcode", None) == _SQLITE_FULL:
            return _FULL[errno.ENOSPC]
    return None


def write_error(path: str | os.PathLike[str], exc: BaseException) -> FluxClusterError:
    """The one line for a write of path that failed with exc; a full disk says so and what to do."""
    full = full_disk(exc)
    if full:
        return FluxClusterError(f"{full} while writing {path}: free space and rerun")
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).strip()
    return FluxClusterError(f"{path}: {reason.splitlines()[0] if reason else type(exc).__name__}")


def allocation_failed(exc: BaseException) -> bool:
    """Whether exc (or a cause of it) is a failed allocation: MemoryError, torch's OutOfMemoryError, or the
    RuntimeError torch's CPU allocator raises ("DefaultCPUAllocator: can't allocate memory"), which
    libraries loading weights otherwise report as a file that does not fit."""
    return any(
        isinstance(cause, MemoryError)
        or type(cause).__name__ == "OutOfMemoryError"
        or (isinstance(cause, RuntimeError) and "can't allocate memory" in str(cause))
        for cause in causes(exc)
    )
