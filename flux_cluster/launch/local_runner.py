"""Run a rendered job script on this machine (launcher 'local'): no Slurm, output tee'd to the run dir."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from flux_cluster.launch.rundir import CONFIG_FILE, RunRecord, lock_held, repeat_done, repeat_lock_path

LOCAL_LOG = "local.log"


def run_local(script_path: Path, run_dir: Path, echo: bool = True) -> int:
    log_path = run_dir / "slurm" / LOCAL_LOG
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        log_path.open("ab") as log,
        subprocess.Popen(
            ["bash", str(script_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=run_dir,
            start_new_session=True,  # its own group: 'flux-cluster cancel' stops torchrun and the ranks too
        ) as process,
    ):
        record = RunRecord(launcher="local", job_ids=[], submitted_at=time.time(), pid=process.pid)
        record.save(run_dir)
        assert process.stdout is not None
        try:
            for line in process.stdout:
                log.write(line)
                log.flush()
                if echo:
                    sys.stdout.buffer.write(line)
                    sys.stdout.flush()
            code = process.wait()
        except KeyboardInterrupt:
            stop_group(process.pid)
            code = process.wait()
    record.exit_code = code
    record.save(run_dir)
    return code


def stop_group(pid: int) -> None:
    """SIGTERM the run's whole process group (bash, torchrun, the ranks)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)


def runner_alive(record: RunRecord, run_dir: Path) -> bool:
    """The recorded job script is still running: its process exists, is not a zombie (a runner blocked
    on output can leave it unreaped) and is still the run's script (pids are reused)."""
    if record.pid is None:
        return False
    proc = Path(f"/proc/{record.pid}")
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = (proc / "cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return state != "Z" and str(run_dir).encode() in cmdline


def local_state(run_dir: Path, record: RunRecord) -> str:
    """A local run's state from what is on disk and running now, not only from the first attempt's
    record: a repeat resumed by hand (bash job.sh) holds its lock, and finished repeats are marked."""
    try:
        nexp = int(yaml.safe_load((run_dir / CONFIG_FILE).read_text())["job"].get("nexp", 1))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        nexp = 1
    if runner_alive(record, run_dir) or any(lock_held(repeat_lock_path(run_dir, i)) for i in range(nexp)):
        return "RUNNING"
    if all(repeat_done(run_dir, i) for i in range(nexp)):
        return "COMPLETED"
    if record.launcher == "dry-run":
        return "NOT SUBMITTED"
    if record.exit_code is not None:
        return "COMPLETED" if record.exit_code == 0 else f"FAILED (exit {record.exit_code})"
    return "FAILED (the runner was killed before it recorded an exit code)"
