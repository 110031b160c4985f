"""Shared by the data tests: a small synthetic Energon root, and a helper run on 2 gloo ranks."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from flux_cluster.cli import app


def make_energon_root(base: Path, train: int, val: int, shard_size: int | None = None) -> Path:
    """synth + prepare-data through the CLI; returns the verified Energon root."""
    cli = CliRunner()
    result = cli.invoke(app, ["data", "synth", str(base / "src"), "--train", str(train), "--val", str(val)])
    assert result.exit_code == 0, result.output
    args = ["prepare-data", "--input", str(base / "src"), "--output", str(base / "root")]
    result = cli.invoke(app, args + (["--shard-size", str(shard_size)] if shard_size else []))
    assert result.exit_code == 0, result.output
    return base / "root"


def run_two_ranks(helper: Path, root: Path, out: Path) -> list[dict[str, Any]]:
    """torchrun the helper with (root, out) on 2 processes; returns each rank's out/rank<r>.json."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(helper),
            str(root),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
