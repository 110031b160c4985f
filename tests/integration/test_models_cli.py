"""flux-cluster models tiny as a user runs it, in a fresh process."""

import os
import subprocess
import sys
from pathlib import Path


def test_models_tiny_prints_only_its_own_line(tmp_path: Path) -> None:
    """In a fresh process, as a user runs it: the libraries' notices are logged on import, before any
    command code runs, so this is the only place they can be seen."""
    result = subprocess.run(
        [sys.executable, "-m", "flux_cluster", "models", "tiny", str(tmp_path / "tiny")],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout.startswith("wrote a tiny random-init FLUX.1-schnell")
