"""Follow a launched run from its run directory: its jobs' states, its log files, cancel. The CLI's
runs/status/logs/cancel and the API's Run both use these."""

import time
from pathlib import Path

from flux_cluster.errors import FluxClusterError
from flux_cluster.launch.rundir import RunRecord, resolve_run, runs_root


def load_run(run: str | Path | None, runs_dir: Path | None = None) -> tuple[Path, RunRecord]:
    """A run (path, '<experiment>/<name>', unique suffix, or the latest) and its jobs.json."""
    run_dir = resolve_run(None if run is None else str(run), runs_root(runs_dir))
    record = RunRecord.load(run_dir)
    if record is None:
        raise FluxClusterError(f"{run_dir}: no jobs.json: the run was never started")
    return run_dir, record


def run_states(run_dir: Path, record: RunRecord) -> dict[str, str]:
    """Job (or array task) id -> state; a local or dry run has one entry, named by its launcher."""
    if record.launcher != "slurm":
        from flux_cluster.launch.local_runner import local_state

        return {record.launcher: local_state(run_dir, record)}
    from flux_cluster.launch import slurm

    return slurm.job_states(record.job_ids)


def is_final(state: str) -> bool:
    """A state no job leaves again: Slurm's final states and a local run's COMPLETED/FAILED/NOT SUBMITTED."""
    from flux_cluster.launch import slurm

    return slurm.is_final(state) or state.startswith(("FAILED", "NOT SUBMITTED"))


def wait_run(
    run_dir: Path, record: RunRecord, poll_s: float = 5.0, timeout_s: float | None = None
) -> dict[str, str]:
    """Block until every job of the run has ended; their final states (run_states). timeout_s: a
    FluxClusterError if they have not ended by then."""
    if record.launcher == "slurm":
        from flux_cluster.launch import slurm

        return slurm.wait_until_final(record.job_ids, poll_s, timeout_s=timeout_s)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        record = RunRecord.load(run_dir) or record  # the local runner records its exit code at the end
        states = run_states(run_dir, record)
        if all(is_final(state) for state in states.values()):
            return states
        if deadline is not None and time.monotonic() > deadline:
            now = ", ".join(sorted(set(states.values())))
            raise FluxClusterError(f"{run_dir}: still {now} after {timeout_s:g} s")
        time.sleep(poll_s)


def log_files(run_dir: Path, record: RunRecord, stderr: bool = False) -> list[Path]:
    """The output of every job of the run (a local run: its one log, stdout and stderr together)."""
    from flux_cluster.launch.local_runner import LOCAL_LOG

    if record.launcher != "slurm":
        return [run_dir / "slurm" / LOCAL_LOG]
    from flux_cluster.launch import slurm

    return [slurm.log_path(job_id, run_dir / "slurm", stderr) for job_id in record.job_ids]


def cancel_run(run_dir: Path, record: RunRecord) -> str:
    """scancel every job of the run, or stop a local run's process group; returns what was done."""
    if record.launcher != "slurm":
        from flux_cluster.launch.local_runner import runner_alive, stop_group

        if record.pid is not None and runner_alive(record, run_dir):
            stop_group(record.pid)
            return f"stopped local run {run_dir} (process group {record.pid})"
        return f"{record.launcher} run {run_dir} is not running"
    from flux_cluster.launch import slurm

    slurm.cancel(record.job_ids, run_dir / "slurm")
    return f"cancelled {', '.join(record.job_ids)}"
