"""Slurm through submitit: submit our rendered script, read states from sacct, cancel, requeue.

submitit normally writes its own sbatch text around a pickled function; here the executor's text is
the Jinja rendering, so the file Slurm runs is exactly the one stored in the run directory.
"""

import contextlib
import io
import shutil
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from flux_cluster.errors import FluxClusterError
from flux_cluster.rundir import JOB_ID

if TYPE_CHECKING:
    from submitit.slurm.slurm import SlurmJob

FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


def check_job_id(job_id: object, where: str = "job id") -> str:
    """job_id when it has Slurm's form; else one FluxClusterError line, before any Slurm tool is called."""
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        from flux_cluster.safe_text import printable

        raise FluxClusterError(
            f"{where}: {printable(repr(job_id))} is not a Slurm job id (digits, optionally _N, _[...] or +N)"
        )
    return job_id


def check_job_ids(job_ids: Iterable[object], where: str = "job id") -> list[str]:
    return [check_job_id(job_id, where) for job_id in job_ids]


def is_final(state: str) -> bool:
    """sacct states carry suffixes ('CANCELLED by 0'): compare the first word."""
    return state.split()[0] in FINAL_STATES if state else False


def wait_until_final(
    job_ids: list[str], poll_s: float = 2.0, unknown_limit_s: float = 120.0, timeout_s: float | None = None
) -> dict[str, str]:
    """Poll sacct until every job has ended; their final states. Fails clearly if sacct knows none of them
    for too long, or (timeout_s) if they have not ended in that time."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    unknown_since: float | None = None
    while True:
        states = job_states(job_ids)
        if all(is_final(state) for state in states.values()):
            return states
        if all(state == "UNKNOWN" for state in states.values()):
            unknown_since = unknown_since or time.monotonic()
            if time.monotonic() - unknown_since > unknown_limit_s:
                raise FluxClusterError(
                    f"sacct has reported no state for {', '.join(job_ids)} for {unknown_limit_s:.0f} s: "
                    "is Slurm accounting (slurmdbd) running?"
                )
        else:
            unknown_since = None
        if deadline is not None and time.monotonic() > deadline:
            now = ", ".join(sorted(set(states.values())))
            raise FluxClusterError(f"jobs {', '.join(job_ids)}: still {now} after {timeout_s:g} s")
        time.sleep(poll_s)


def _require(tool: str) -> None:
    if shutil.which(tool) is None:
        raise FluxClusterError(f"'{tool}' not found on PATH: is this a Slurm login node? (see README, Slurm)")


def submit_script(script: str, folder: Path) -> str:
    """sbatch the exact script text; returns the job id (the array's base id for arrays)."""
    _require("sbatch")
    from submitit.core.utils import FailedJobError
    from submitit.slurm.slurm import SlurmExecutor

    class _RenderedScriptExecutor(SlurmExecutor):
        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return script

    folder.mkdir(parents=True, exist_ok=True)
    executor = _RenderedScriptExecutor(folder=folder)
    try:
        # submitit prints sbatch's stderr as well as raising it: the error line below says it once
        with contextlib.redirect_stderr(io.StringIO()):
            job = executor._submit_command("flux-cluster")  # the command is unused: the script is complete
    except FailedJobError as exc:
        from flux_cluster.safe_text import printable

        message = str(exc).strip().splitlines()
        raise FluxClusterError(
            f"sbatch refused the job: {printable(message[-1]) if message else exc}"
        ) from None
    return check_job_id(str(job.job_id), "sbatch's job id")


def array_task_ids(base_id: str, count: int) -> list[str]:
    return [f"{base_id}_{i}" for i in range(count)]


def job_states(job_ids: Iterable[str]) -> dict[str, str]:
    """Current state of every job (or array task) id, read from sacct through submitit's watcher."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    watcher = SlurmInfoWatcher(delay_s=0)
    ids = check_job_ids(job_ids)
    for job_id in ids:
        watcher.register_job(job_id)
    watcher.update()
    return {job_id: watcher.get_state(job_id, mode="cache") for job_id in ids}


def job_info(job_id: str) -> dict[str, str]:
    """sacct fields of one job: state, elapsed, restarts, node list, exit code."""
    check_job_id(job_id)
    _require("sacct")
    fields = "JobID,State,Elapsed,NodeList,ExitCode,Start"
    out = subprocess.run(
        ["sacct", "-j", job_id, "-X", "--parsable2", "--noheader", "-o", fields],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    names = fields.split(",")
    for line in out.splitlines():
        values = dict(zip(names, line.split("|"), strict=False))
        if values.get("JobID") == job_id:
            return values
    return {}


def _job(job_id: str, folder: Path) -> "SlurmJob[None]":
    from submitit.slurm.slurm import SlurmJob

    return SlurmJob(folder=folder, job_id=job_id)


def log_path(job_id: str, folder: Path, stderr: bool = False) -> Path:
    """stdout (or stderr) of a job or array task, as submitit lays them out (the script's --output)."""
    paths = _job(check_job_id(job_id), folder).paths
    return paths.stderr if stderr else paths.stdout


def _tool_error(result: "subprocess.CompletedProcess[str]") -> str:
    from flux_cluster.safe_text import printable

    lines = result.stderr.strip().splitlines()
    return printable(lines[-1]) if lines else f"exit code {result.returncode}"


def cancel(job_ids: Iterable[str], folder: Path) -> None:
    """scancel every id (checked first; '--' ends scancel's options, so no id is read as one)."""
    ids = check_job_ids(job_ids)
    _require("scancel")
    for job_id in ids:
        result = subprocess.run(["scancel", "--", job_id], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise FluxClusterError(f"scancel {job_id} failed: {_tool_error(result)}")


def requeue(job_ids: Iterable[str]) -> None:
    ids = check_job_ids(job_ids)
    _require("scontrol")
    for job_id in ids:
        # '--' before the command word: scontrol reads no option past it
        result = subprocess.run(
            ["scontrol", "--", "requeue", job_id], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise FluxClusterError(f"scontrol requeue {job_id} failed: {_tool_error(result)}")


def batch_script(job_id: str) -> str:
    """The script Slurm stored for a job (``scontrol write batch_script JOB -``)."""
    check_job_id(job_id)
    _require("scontrol")
    result = subprocess.run(
        ["scontrol", "--", "write", "batch_script", job_id, "-"], capture_output=True, check=False
    )
    if result.returncode != 0:
        raise FluxClusterError(f"scontrol write batch_script {job_id}: {result.stderr.decode().strip()}")
    return result.stdout.decode()
