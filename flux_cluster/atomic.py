"""Atomic file writes: a reader sees the old file or the whole new one, never half of it."""

import math
import os
import tempfile
from pathlib import Path
from typing import Any


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(path: Path, data: str | bytes, mode: int | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600, which would hide run files from teammates and from containers.
        os.chmod(tmp, _default_mode() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def finite_for_json(value: Any) -> Any:
    """NaN and infinities (a diverged run's loss, say) become null: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_for_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_for_json(v) for v in value]
    return value
