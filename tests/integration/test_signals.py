"""The rank side of checkpoint-and-requeue, with real processes and real signals."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flux_cluster.runtime.exit_codes import INTERRUPTED_EXIT_CODE
from flux_cluster.runtime.signals import finish_interrupted, relay

RANK = """
import sys, time
from flux_cluster.runtime.signals import StopRequest
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


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def test_loader_workers_outlive_the_signals_slurm_sends_to_every_process(tmp_path: Path) -> None:
    """Slurm signals every process of a step (preemption, requeue, scancel). Torch's workers would die of
    SIGTERM, and the checkpoint that signal asks for (it fetches the workers' loader state) would fail."""
    from data_helpers import make_energon_root

    from flux_cluster.data.format import DIMS
    from flux_cluster.data.loader import train_loader

    root = make_energon_root(tmp_path, 24, 8)
    loader = train_loader(root, batch_size=2, rank=0, world_size=1, seed=1, num_workers=1, dims=DIMS["tiny"])
    before = set(_children(os.getpid()))
    batches = iter(loader)
    next(batches)
    (worker,) = set(_children(os.getpid())) - before
    for name in ("TERM", "USR1", "INT"):  # from another process, as slurmstepd sends them
        subprocess.run(["kill", f"-{name}", str(worker)], check=True)
    time.sleep(0.5)
    assert Path(f"/proc/{worker}").exists()
    state = loader.save_state_rank()  # asks the worker
    assert state is not None and len([next(batches) for _ in range(3)]) == 3
    os.kill(worker, signal.SIGTERM)  # from its parent: torch's own way of stopping a worker still works
    deadline = time.monotonic() + 10
    while worker in _children(os.getpid()) and Path(f"/proc/{worker}/status").exists():
        if "zombie" in Path(f"/proc/{worker}/status").read_text():
            break
        assert time.monotonic() < deadline, "the worker ignored its parent's SIGTERM"
        time.sleep(0.05)


# A rank as torchrun starts it: in its own session, so killing torchrun's process group misses it.
TORCHRUN_RANK = """
import time
from flux_cluster.runtime.signals import die_with_parent, under_torchrun
if under_torchrun():
    die_with_parent()
print("rank up", flush=True)
time.sleep(120)
"""


def test_ranks_die_with_a_killed_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(TORCHRUN_RANK)
    pid_file = tmp_path / "out.txt"
    with pid_file.open("w") as out:
        torchrun = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", script],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while "rank up" not in pid_file.read_text():
        assert torchrun.poll() is None and time.monotonic() < deadline, pid_file.read_text()
        time.sleep(0.1)
    (rank,) = _children(torchrun.pid)
    assert os.getsid(rank) != os.getsid(torchrun.pid)  # what makes 'kill -9 -<group>' miss it
    os.killpg(torchrun.pid, signal.SIGKILL)
    torchrun.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{rank}").exists() and "zombie" not in Path(f"/proc/{rank}/status").read_text():
        assert time.monotonic() < deadline, "the rank outlived torchrun"
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" in status.read_text()
    except OSError:
        return True


def test_a_killed_job_script_takes_the_local_launcher_and_its_ranks_with_it(tmp_path: Path) -> None:
    """kill -9 of a local run's job.sh: the launcher (torchrun) gets SIGTERM from the kernel, stops its
    ranks and says so in one line, no traceback; nothing is left training or holding the run's lock."""
    script = tmp_path / "rank.py"
    script.write_text(TORCHRUN_RANK)
    out_file = tmp_path / "out.txt"
    launch = f"{sys.executable} -m flux_cluster.jobs.local_launch --standalone --nproc-per-node=1 {script}"
    with out_file.open("w") as out:
        job_sh = subprocess.Popen(
            ["bash", "-c", f"{launch}; echo unreachable"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while "rank up" not in out_file.read_text():
        assert job_sh.poll() is None and time.monotonic() < deadline, out_file.read_text()
        time.sleep(0.1)
    (launcher,) = _children(job_sh.pid)
    (rank,) = _children(launcher)
    os.kill(job_sh.pid, signal.SIGKILL)  # the script alone, as 'kill -9 PID' does
    job_sh.wait()
    deadline = time.monotonic() + 40
    while not (_gone(launcher) and _gone(rank)):
        assert time.monotonic() < deadline, "the launcher or its rank outlived the killed job script"
        time.sleep(0.1)
    deadline = time.monotonic() + 5
    while "stopped by SIGTERM" not in out_file.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    output = out_file.read_text()
    assert "[launch] stopped by SIGTERM: the ranks were stopped" in output and "Traceback" not in output, (
        output
    )
