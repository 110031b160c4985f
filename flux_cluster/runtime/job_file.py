"""Reading the options a command wrote beside a job's config for the job (never rendered into shell)."""

import json
from pathlib import Path

from flux_cluster.errors import FluxClusterError


def read_job_file(path: Path, written_by: str) -> dict:
    """A JSON object a command wrote beside a job's config for the job (its options: never rendered into
    shell); anything else is one FluxClusterError line naming the file and what was expected."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise FluxClusterError(f"{path}: cannot read it ({exc.strerror}): expected {written_by}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise FluxClusterError(f"{path}: not JSON ({exc}): expected {written_by}") from None
    if not isinstance(data, dict):
        raise FluxClusterError(f"{path}: got {type(data).__name__}, expected a JSON object: {written_by}")
    return data
