"""The rank side of checkpoint-and-requeue, with real processes and real signals."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from flux_cluster.jobs.signals import INTERRUPTED_EXIT_CODE, finish_interrupted, relay

RANK = """
import sys, time
from flux_cluster.jobs.signals import StopRequest
stop = StopRequest().install()
print("ready", flush=True)
deadline = time.monotonic() + 20
while not stop.requested and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(3 if stop.requested else 1)
"""


def test_relay_signals_exactly_the_registered_ranks(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    env = {"FLUX_PID_DIR": str(pid_dir), "PATH": "/usr/bin:/bin"}
    ranks = [
        subprocess.Popen([sys.executable, "-c", RANK], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    bystander = subprocess.Popen(
        [sys.executable, "-c", RANK], env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE, text=True
    )
    for process in [*ranks, bystander]:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    (pid_dir / "999999.pid").write_text("999999\n")  # a rank that already exited
    assert relay(pid_dir) == 2
    assert [p.wait(timeout=10) for p in ranks] == [3, 3]
    assert not (pid_dir / "999999.pid").exists()
    time.sleep(0.3)
    assert bystander.poll() is None, "a process that did not register must not be signalled"
    bystander.kill()


def test_finish_interrupted_writes_the_marker_on_rank_zero_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "requeue-42"
    monkeypatch.setenv("FLUX_REQUEUE_MARKER", str(marker))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert finish_interrupted(rank=1) == 0 and not marker.exists()
    assert finish_interrupted(rank=0) == 0 and marker.read_text() == "42\n"
    monkeypatch.delenv("FLUX_REQUEUE_MARKER")
    assert finish_interrupted(rank=0) == INTERRUPTED_EXIT_CODE  # outside Slurm nothing requeues the run
