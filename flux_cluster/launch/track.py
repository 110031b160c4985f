"""Follow a launched run from its run directory: its jobs' states, its log files, cancel. The API's runs
group (flux_cluster.api: list_runs, run_status, follow_logs, cancel and Run, under the CLI's runs, status,
logs and cancel) uses these."""

import codecs
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flux_cluster.errors import FluxClusterError
from flux_cluster.outside import LINE_LIMIT
from flux_cluster.rundir import RunRecord, cancelled_file, local_log, resolve_run, runs_root, slurm_dir

CHUNK = 1024 * 1024
"""Logs are copied in pieces of this size: memory stays flat whatever a log's size."""
TAIL_WINDOW = 8 * CHUNK
"""--tail reads at most this much from a log's end."""


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
    """A state no job leaves again: Slurm's final states and a local run's COMPLETED/FAILED/CANCELLED/NOT
    SUBMITTED."""
    from flux_cluster.launch import slurm

    return slurm.is_final(state) or state.startswith(("FAILED", "NOT SUBMITTED", "CANCELLED"))


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
    """The output of every job of the run (a local run: its one log, stdout and stderr together, so
    stderr alone is one line saying so)."""
    if record.launcher != "slurm":
        if stderr:
            raise FluxClusterError(
                f"{run_dir}: a local run writes stdout and stderr together to "
                f"{local_log(run_dir).relative_to(run_dir)}; drop --stderr to see both"
            )
        return [local_log(run_dir)]
    from flux_cluster.launch import slurm

    return [slurm.log_path(job_id, slurm_dir(run_dir), stderr) for job_id in record.job_ids]


def copy_log(
    path: Path, run_dir: Path, offset: int, write: Callable[[str], object], tail: int | None = None
) -> int:
    """Copy a job log from offset on (or its last tail lines) to write, in CHUNK pieces; returns the new
    offset. Only a regular file inside the run folder is read (no symlink out of it; a sweep point's links
    into its sweep's arrays/ folder are followed there only); a missing file is no output yet."""
    from flux_cluster.outside import open_regular

    if not os.path.lexists(path):
        return offset
    with open_regular(*_log_source(path, run_dir)) as handle:
        size = os.fstat(handle.fileno()).st_size
        if tail is not None:
            start = max(offset, size - TAIL_WINDOW)
            handle.seek(start)
            lines = handle.read(size - start).splitlines(keepends=True)
            if start > offset:
                lines = lines[1:]  # the first line may be cut by the window
            write(b"".join(lines[-tail:] if tail else []).decode(errors="replace"))
            return size
        handle.seek(offset)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while chunk := handle.read(CHUNK):
            offset += len(chunk)
            write(decoder.decode(chunk))
        write(decoder.decode(b"", final=True))
    return offset


def _log_source(path: Path, run_dir: Path) -> tuple[Path, Path]:
    """(the file to read, the folder it must be in) for a job log of the run: the log itself, in the run
    folder; a sweep point's Slurm logs link to its array's output, in the sweep folder's arrays/."""
    arrays = run_dir.parent / "arrays"
    if path.is_symlink() and arrays.is_dir():
        try:
            target, inside = path.resolve(), arrays.resolve()
        except (OSError, RuntimeError):  # a symlink loop (RuntimeError until Python 3.13): no such log
            return path, run_dir
        if target.is_relative_to(inside):
            return target, arrays
    return path, run_dir


def log_tail(path: Path, run_dir: Path, limit: int) -> str:
    """The last limit bytes of a job log of the run, read as copy_log reads it (a regular file inside its
    folder, never more); '' where there is none yet, or what is there is no such file."""
    from flux_cluster.outside import OutsideFileError, read_tail

    if not os.path.lexists(path):
        return ""
    source, root = _log_source(path, run_dir)
    try:
        return read_tail(source, limit, inside=root).decode(errors="replace")
    except OutsideFileError:
        return ""


def cancel_run(run_dir: Path, record: RunRecord) -> str:
    """scancel every job of the run, or stop a local run: its process group, and whatever holds one of
    its repeat locks (a torchrun or rank left running by a killed job.sh, a repeat resumed by hand);
    returns what was done."""
    if record.launcher != "slurm":
        return _stop_local(run_dir, record)
    from flux_cluster.launch import slurm

    slurm.cancel(record.job_ids, slurm_dir(run_dir))
    return f"cancelled {', '.join(record.job_ids)}"


def _stop_local(run_dir: Path, record: RunRecord) -> str:
    from flux_cluster.atomic import write_atomic
    from flux_cluster.launch.local_runner import lock_holders, runner_alive, stop_group, stop_holder

    alive = record.pid is not None and runner_alive(record, run_dir)
    holders = lock_holders(run_dir)
    if not alive and not holders:
        return f"{record.launcher} run {run_dir} is not running"
    cancelled_file(run_dir).parent.mkdir(exist_ok=True)
    write_atomic(cancelled_file(run_dir), f"{time.time()}\n")
    stopped = []
    if alive and record.pid is not None:
        stop_group(record.pid)
        stopped.append(f"process group {record.pid}")
    for pid in holders:
        if stop_holder(pid, record.pid if alive else None):
            stopped.append(f"lock holder {pid}")
    return f"stopped local run {run_dir} ({', '.join(stopped) or 'it had ended'})"


@dataclass(frozen=True)
class RunRow:
    """One run under a runs folder, as `runs list` shows it."""

    run: str
    """'<experiment>/<name>'."""
    system: str
    job: str
    launcher: str
    """slurm, local or dry-run; '-' for a run never started (no jobs.json)."""
    job_ids: list[str]
    state: str
    """Its jobs' states, joined where they differ; 'not started' without jobs.json."""
    submitted_at: float | None


@dataclass(frozen=True)
class RunListing:
    root: Path
    rows: list[RunRow]
    skipped: list[str]
    """One line per folder that could not be read (another version's, a damaged one): the rest are listed."""


def list_run_rows(root: Path) -> RunListing:
    """Every run under root with its live state, oldest first."""
    import yaml

    from flux_cluster.rundir import config_file, list_runs, read_run_config

    rows, skipped = [], []
    for run_dir in list_runs(root):
        name = f"{run_dir.parent.name}/{run_dir.name}"
        try:
            system, job = read_run_config(config_file(run_dir))
            record = RunRecord.load(run_dir)
            state = "not started"
            if record is not None:
                state = ", ".join(sorted(set(run_states(run_dir, record).values())))
        except (OSError, ValueError, KeyError, TypeError, FluxClusterError, yaml.YAMLError) as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            skipped.append(f"skipped {name}: {reason}")
            continue
        rows.append(
            RunRow(
                run=name,
                system=system.name,
                job=str(job["name"]),
                launcher=record.launcher if record else "-",
                job_ids=list(record.job_ids) if record else [],
                state=state,
                submitted_at=record.submitted_at if record else None,
            )
        )
    return RunListing(root, rows, skipped)


@dataclass(frozen=True)
class JobStatus:
    """One job (or array task) of a run, as `status` shows it."""

    job: str
    """Its Slurm id; a local or dry run: its process id, '-' without one."""
    state: str
    elapsed: str = "-"
    nodes: str = "-"
    exit_code: str = "-"


def job_statuses(run_dir: Path, record: RunRecord) -> list[JobStatus]:
    """Each job's live state; a Slurm job's elapsed time, nodes and exit code too (sacct)."""
    states = run_states(run_dir, record)
    if record.launcher != "slurm":
        return [JobStatus(str(record.pid or "-"), states[record.launcher])]
    from flux_cluster.launch import slurm

    statuses = []
    for job_id in record.job_ids:
        info = slurm.job_info(job_id)
        fields = (info.get(key, "-") for key in ("Elapsed", "NodeList", "ExitCode"))
        statuses.append(JobStatus(job_id, states[job_id], *fields))
    return statuses


def dry_run_note(run_dir: Path) -> str:
    """What a dry run is and how to start it."""
    import yaml

    from flux_cluster.rundir import config_file

    try:
        local = yaml.safe_load(config_file(run_dir).read_text())["system"]["launcher"] == "local"
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        local = False
    return (
        "a dry run (--dry-run): its job.sh was written, nothing was started; run it with "
        + ("'bash job.sh'" if local else "'sbatch job.sh'")
        + " in the run folder, or submit again"
    )


def stream_logs(
    run_dir: Path,
    record: RunRecord,
    write: Callable[[str], object],
    *,
    follow: bool = False,
    task: int | None = None,
    stderr: bool = False,
    tail: int | None = None,
    poll_s: float = 1.0,
) -> None:
    """Write the run's job output (every repeat, or the array task index task) to write, streamed: any
    size in flat memory. An array run's lines start with their task ('[task 3] ...'); several unlabelled
    logs each get a '==> name <==' header. tail: only the last lines of each; follow: until the jobs end."""
    if record.launcher == "dry-run":  # no job, so no output and no end to wait for
        raise FluxClusterError(
            f"{run_dir}: never submitted (prepared with --dry-run): no job output to show or follow; "
            f"a job.sh submitted by hand writes its output to {slurm_dir(run_dir)}/"
        )
    files = log_files(run_dir, record, stderr)
    labels = [f"[task {job_id.rsplit('_', 1)[-1]}] " if record.array else "" for job_id in record.job_ids]
    labels = labels or [""] * len(files)  # a local run: one log, no job ids
    if task is not None:
        if not 0 <= task < len(files):
            raise FluxClusterError(f"--task {task}: the run has tasks 0..{len(files) - 1}")
        files, labels = [files[task]], [""]
    offsets = dict.fromkeys(files, 0)
    pending = dict.fromkeys(files, "")  # a labelled file's last line until it is complete
    first = True
    while True:
        # the state first, then the output: once the jobs have ended, this read gets all of it
        done = not follow or all(is_final(state) for state in run_states(run_dir, record).values())
        for path, label in zip(files, labels, strict=True):
            if not label:
                if len(files) > 1 and not follow and os.path.lexists(path):
                    write(f"==> {path.name} <==\n")
                offsets[path] = copy_log(path, run_dir, offsets[path], write, tail if first else None)
                continue

            def labelled(text: str, path: Path = path, label: str = label) -> None:
                *lines, pending[path] = (pending[path] + text).split("\n")
                if len(pending[path]) > LINE_LIMIT:  # a line without end: show it in pieces
                    lines.append(pending[path])
                    pending[path] = ""
                write("".join(f"{label}{line}\n" for line in lines))

            offsets[path] = copy_log(path, run_dir, offsets[path], labelled, tail if first else None)
            if done and pending[path]:
                write(f"{label}{pending[path]}\n")
                pending[path] = ""
        first = False
        if done:
            return
        time.sleep(poll_s)
        if record.launcher == "local":
            record = RunRecord.load(run_dir) or record
