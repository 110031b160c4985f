"""Why a failed sweep point failed, from the end of its job's logs: read bounded (outside.read_tail), and only
from the point's own folder or its array's output in the sweep's arrays/, as `logs` reads them."""

import os
import tracemalloc
from pathlib import Path

from flux_cluster.launch import slurm
from flux_cluster.launch.sweep_status import _failure
from flux_cluster.rundir import RunRecord, slurm_dir

JOB = "12_0"
STATES = {JOB: "FAILED"}


def _point(sweep: Path) -> tuple[Path, Path]:
    """A Slurm point (run folder) whose stdout links to its array task's output: (run, the output)."""
    run = sweep / "20260101-000000-p000"
    slurm_dir(run).mkdir(parents=True)
    RunRecord(launcher="slurm", job_ids=[JOB], submitted_at=0.0).save(run)
    output = slurm.log_path(JOB, sweep / "arrays" / "20260101-000000-nodes1" / "slurm")
    output.parent.mkdir(parents=True)
    link = slurm.log_path(JOB, slurm_dir(run))
    link.symlink_to(os.path.relpath(output, link.parent))
    return run, output


def test_a_huge_log_is_searched_from_its_end_in_flat_memory(tmp_path: Path) -> None:
    run, output = _point(tmp_path / "sweep")
    with output.open("wb") as log:
        log.truncate(64 << 20)  # 64 MB (sparse) before the last line
        log.seek(0, 2)
        log.write(b"torch.OutOfMemoryError: CUDA out of memory\n")
    _failure(run, STATES)  # its imports, before the measurement
    tracemalloc.start()
    try:
        verdict = _failure(run, STATES)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert verdict == ("oom", "out of memory (see the run's log)")
    assert peak < 8 << 20, f"peak {peak} bytes for a 64 MB log"  # jobs.json's read: 4 MiB


def test_a_log_linked_out_of_the_sweep_is_not_read(tmp_path: Path) -> None:
    run, output = _point(tmp_path / "sweep")
    output.write_text("error: what the array task said\n")
    assert _failure(run, STATES) == ("failed", "error: what the array task said")
    secret = tmp_path / "secret.txt"
    secret.write_text("error: a line of someone else's file\n")
    stderr = slurm.log_path(JOB, slurm_dir(run), stderr=True)
    stderr.symlink_to(secret)  # not into arrays/: refused, as `logs` refuses it
    assert _failure(run, STATES) == ("failed", "error: what the array task said")


def test_a_log_link_that_loops_is_no_log(tmp_path: Path) -> None:
    """A point's log links that loop (or a loop on the way into arrays/) are read as no log: the point's
    reason comes from its other log, and `logs` says in one line that the file is not one it reads."""
    import io

    import pytest

    from flux_cluster.errors import FluxClusterError
    from flux_cluster.launch.track import stream_logs

    run, output = _point(tmp_path / "sweep")
    output.write_text("error: what the array task said\n")
    stderr = slurm.log_path(JOB, slurm_dir(run), stderr=True)
    loop = stderr.with_name("loop")
    stderr.symlink_to(loop.name)
    loop.symlink_to(stderr.name)
    assert _failure(run, STATES) == ("failed", "error: what the array task said")
    record = RunRecord.load(run)
    assert record is not None
    with pytest.raises(FluxClusterError) as refused:
        stream_logs(run, record, io.StringIO().write, stderr=True)
    assert "\n" not in str(refused.value) and "Symlink loop" not in str(refused.value)
