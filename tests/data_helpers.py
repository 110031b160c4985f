"""Shared by the data tests: a small synthetic Energon root, a helper run on 2 gloo ranks, and a small
disk to fill (tmpfs)."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.data.prep.demo_images import write_image_folder  # noqa: F401  (re-exported for tests)


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


@contextmanager
def small_disk(path: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at path for disk-full tests; the test skips where mount is refused."""
    path.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    result = subprocess.run(mount, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"a disk-full test needs a small tmpfs, and mount was refused: {result.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode != 0:
            subprocess.run(["umount", "--lazy", str(path)], check=False)  # still open: detach it now


def fill_disk(disk: Path, leave: int) -> None:
    """Take all but ``leave`` bytes of the disk's free space."""
    stat = os.statvfs(disk)
    with (disk / "filler").open("wb") as handle:
        os.posix_fallocate(handle.fileno(), 0, max(stat.f_bavail * stat.f_frsize - leave, 1))
