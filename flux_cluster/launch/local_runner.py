"""Run a rendered job script on this machine (launcher 'local'): no Slurm, output tee'd to the run dir."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from flux_cluster.rundir import (
    MAX_PID,
    RunRecord,
    cancelled_file,
    checkpoints_dir,
    config_file,
    local_log,
    lock_held,
    lock_holder_pids,
    repeat_done,
    repeat_lock_path,
    state_dir,
)


def run_local(script_path: Path, run_dir: Path, echo: bool = True) -> int:
    log_path = local_log(run_dir)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cancelled_file(run_dir).unlink(missing_ok=True)  # an earlier attempt's cancel
    with (
        log_path.open("ab") as log,
        subprocess.Popen(
            ["bash", str(script_path)],
            stdin=subprocess.DEVNULL,  # nothing typed or piped reaches a rank (a library's y/N prompt)
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


def lock_holders(run_dir: Path) -> list[int]:
    """The processes holding one of the run's repeat locks (state/exp_<i>.lock) that are this run's
    (their command line names the run folder): a lock file that is a symlink, or leads out of the run
    folder, could name any process's lock, so it is not followed."""
    from flux_cluster.outside import OutsideFileError, open_regular

    found: list[int] = []
    for path in sorted(state_dir(run_dir).glob("exp_*.lock")):
        try:
            with open_regular(path, inside=run_dir):
                pass
        except OutsideFileError:
            continue
        found += [
            pid
            for pid in lock_holder_pids(path)
            if pid not in found and pid != os.getpid() and _mentions(pid, run_dir)
        ]
    return found


def _mentions(pid: int, run_dir: Path) -> bool:
    try:
        return str(run_dir.absolute()).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop_holder(pid: int, group_stopped: int | None) -> bool:
    """SIGTERM a lock holder and its process group (a rank and its loader workers), unless that group
    is ours or was already stopped; only the process itself when it shares our group. False if gone."""
    if not 1 < pid <= MAX_PID:
        return False
    try:
        group = os.getpgid(pid)
        if group in (group_stopped, os.getpgrp()) or group <= 1:
            os.kill(pid, signal.SIGTERM)
        else:
            os.killpg(group, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    return True


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
        nexp = int(yaml.safe_load(config_file(run_dir).read_text())["job"].get("nexp", 1))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        nexp = 1
    if runner_alive(record, run_dir) or any(lock_held(repeat_lock_path(run_dir, i)) for i in range(nexp)):
        return "RUNNING"
    if all(repeat_done(run_dir, i) for i in range(nexp)):
        return "COMPLETED"
    if record.launcher == "dry-run":
        return "NOT SUBMITTED"
    if cancelled_file(run_dir).exists():
        checkpoint = latest_checkpoint(run_dir)
        return "CANCELLED" + (f" (checkpoint {checkpoint})" if checkpoint else " (no checkpoint written)")
    if record.exit_code is not None:
        return "COMPLETED" if record.exit_code == 0 else f"FAILED (exit {record.exit_code})"
    return "FAILED (the runner was killed before it recorded an exit code)"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint folder of the run's repeats (train.checkpoint_dir or run_dir/checkpoints)."""
    base = checkpoints_dir(run_dir)
    try:
        train = yaml.safe_load(config_file(run_dir).read_text())["system"].get("train") or {}
        if train.get("checkpoint_dir"):
            base = checkpoints_dir(run_dir, train["checkpoint_dir"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        pass
    found = [p for p in base.glob("exp_*/step_*") if p.is_dir()]
    return max(found, key=lambda p: (p.name, p.parent.name)) if found else None
