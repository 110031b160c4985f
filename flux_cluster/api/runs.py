"""Runs: submit, preflight, list, open, follow, cancel and requeue a job (one launch path for the CLI and
Python: the CLI's submit, preflight, runs list, status, logs, cancel and requeue call these)."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flux_cluster.errors import FluxClusterError
from flux_cluster.rundir import RunRecord, script_file, throughput_file

if TYPE_CHECKING:
    from flux_cluster.config.schema import SystemConfig
    from flux_cluster.launch.track import JobStatus, RunListing


def load_system(name: str, overrides: Sequence[str] = ()) -> "SystemConfig":
    """A system's validated config (configs/systems/<name>.yaml or a YAML file) with KEY=VALUE overrides."""
    from flux_cluster.config import load_system as load

    return load(name, list(overrides)).config


@dataclass
class Run:
    """A launched run, followed through its run directory (any process can open it again: open_run)."""

    run_dir: Path
    exit_code: int | None = None
    """A local run's exit code (set when submit ran it here)."""

    @property
    def record(self) -> RunRecord:
        record = RunRecord.load(self.run_dir)
        if record is None:
            raise FluxClusterError(f"{self.run_dir}: no jobs.json: the run was never started")
        return record

    @property
    def job_ids(self) -> list[str]:
        return list(self.record.job_ids)

    @property
    def launcher(self) -> str:
        """slurm, local, or dry-run (prepared with --dry-run: nothing started)."""
        return self.record.launcher

    def states(self) -> dict[str, str]:
        """Job (array task) id -> its Slurm state; a local run: {'local': COMPLETED/RUNNING/FAILED (...)}."""
        from flux_cluster.launch.track import run_states

        return run_states(self.run_dir, self.record)

    def status(self) -> str:
        """One word for the whole run: the jobs' states, joined when they differ."""
        return ", ".join(sorted(set(self.states().values())))

    def jobs(self) -> "list[JobStatus]":
        """Each job (array task) with its live state; a Slurm job's elapsed time, nodes and exit code too
        (sacct); a local or dry run: one, its process."""
        from flux_cluster.launch.track import job_statuses

        return job_statuses(self.run_dir, self.record)

    def dry_run_note(self) -> str | None:
        """A dry run: what it is and how to start it; None for a run that was started."""
        from flux_cluster.launch.track import dry_run_note

        return dry_run_note(self.run_dir) if self.launcher == "dry-run" else None

    def done(self) -> bool:
        from flux_cluster.launch.track import is_final

        return all(is_final(state) for state in self.states().values())

    def wait(self, poll_s: float = 5.0, timeout_s: float | None = None) -> str:
        """Block until every job has ended; returns status(). timeout_s: a FluxClusterError after it."""
        from flux_cluster.launch.track import wait_run

        states = wait_run(self.run_dir, self.record, poll_s, timeout_s)
        return ", ".join(sorted(set(states.values())))

    def script(self) -> str:
        """The job script, as Slurm runs it (a dry run's, to submit by hand)."""
        return script_file(self.run_dir).read_text()

    def logs(self, stderr: bool = False) -> str:
        """The jobs' output so far, every job's in turn (as follow_logs writes it)."""
        parts: list[str] = []
        self.follow_logs(parts.append, stderr=stderr)
        return "".join(parts)

    def follow_logs(
        self,
        write: Callable[[str], object],
        *,
        follow: bool = False,
        task: int | None = None,
        stderr: bool = False,
        tail: int | None = None,
    ) -> None:
        """The jobs' output to write, streamed (any size in flat memory; only regular files inside the run
        folder are read): every repeat, or array task index task; an array run's lines start with their
        task ('[task 3] ...'). tail: the last lines of each log only; follow: until the jobs end. A dry run
        has none: one FluxClusterError line."""
        from flux_cluster.launch.track import stream_logs

        stream_logs(self.run_dir, self.record, write, follow=follow, task=task, stderr=stderr, tail=tail)

    def cancel(self) -> str:
        from flux_cluster.launch.track import cancel_run

        return cancel_run(self.run_dir, self.record)

    def throughput(self) -> dict[str, Any] | None:
        """A throughput job's record (results/throughput.json), None until it is written."""
        import json

        path = throughput_file(self.run_dir)
        return json.loads(path.read_text()) if path.is_file() else None


def submit(
    system: str = "local",
    job: str = "train",
    overrides: Sequence[str] = (),
    *,
    synthetic: bool = False,
    warmup_steps: int = 5,
    steps: int = 20,
    nexp: int | None = None,
    seed: int | None = None,
    experiment: str | None = None,
    runs_dir: Path | str | None = None,
    dependency: str | None = None,
    dry_run: bool = False,
    echo: bool = False,
) -> Run:
    """flux-cluster submit: a Slurm system returns once queued; local returns when the run has ended.
    echo: copy a local job's output to stdout too (it is always in the run's log)."""
    from flux_cluster.launch.submit import throughput_args

    return _launch(
        system,
        job,
        overrides,
        nexp=nexp,
        seed=seed,
        experiment=experiment,
        runs_dir=runs_dir,
        dependency=dependency,
        dry_run=dry_run,
        echo=echo,
        job_args=throughput_args(warmup_steps, steps) if job == "throughput" else (),
        synthetic=synthetic,
    )


def preflight(
    system: str = "local",
    overrides: Sequence[str] = (),
    *,
    soak_seconds: float = 0.0,
    nexp: int | None = None,
    seed: int | None = None,
    experiment: str | None = None,
    runs_dir: Path | str | None = None,
    dependency: str | None = None,
    dry_run: bool = False,
    echo: bool = False,
) -> Run:
    """flux-cluster preflight: every node's versions, accelerators, all_reduce and its bandwidth, data and
    log roots; soak_seconds keeps all_reduce running that long."""
    soak = soak_seconds > 0
    return _launch(
        system,
        "preflight",
        overrides,
        nexp=nexp,
        seed=seed,
        experiment=experiment,
        runs_dir=runs_dir,
        dependency=dependency,
        dry_run=dry_run,
        echo=echo,
        job_args=("--soak-seconds", f"{soak_seconds:g}") if soak else (),
        extra_minutes=int(soak_seconds // 60) + 1 if soak else 0,
    )


def _launch(
    system: str,
    job: str,
    overrides: Sequence[str],
    *,
    nexp: int | None,
    seed: int | None,
    experiment: str | None,
    runs_dir: Path | str | None,
    dependency: str | None,
    dry_run: bool,
    echo: bool,
    job_args: tuple[str, ...] = (),
    extra_minutes: int = 0,
    synthetic: bool = False,
) -> Run:
    """The one path of submit and preflight: the job's request, launched."""
    from flux_cluster.launch.submit import LaunchRequest, launch

    request = LaunchRequest(
        system=system,
        job=job,
        overrides=list(overrides),
        nexp=nexp,
        seed=seed,
        experiment=experiment,
        runs_dir=Path(runs_dir) if runs_dir is not None else None,
        dependency=dependency,
        dry_run=dry_run,
        job_args=job_args,
        extra_minutes=extra_minutes,
        synthetic=synthetic,
        echo=echo,
    )
    launched = launch(request)
    return Run(launched.run_dir, launched.exit_code)


def open_run(run: str | Path | None = None, runs_dir: Path | str | None = None) -> Run:
    """An existing run: a path, '<experiment>/<name>', a unique suffix, or None for the latest."""
    from flux_cluster.launch.track import load_run

    run_dir, _ = load_run(run, Path(runs_dir) if runs_dir is not None else None)
    return Run(run_dir.absolute())  # the same run after a chdir


def list_runs(runs_dir: Path | str | None = None) -> "RunListing":
    """Every run under the runs folder (runs_dir, else $FLUX_CLUSTER_RUNS, else ./runs), oldest first, with
    its jobs' live state; a folder that cannot be read (another version's, a damaged one) is one line in
    .skipped and the rest are listed."""
    from flux_cluster.launch.track import list_run_rows
    from flux_cluster.rundir import runs_root

    return list_run_rows(runs_root(Path(runs_dir) if runs_dir is not None else None))


def requeue(run: str | Path | None = None, runs_dir: Path | str | None = None) -> list[str]:
    """Requeue every job of a Slurm run (scontrol requeue): it resumes from its last checkpoint. run as for
    open_run; returns the job ids requeued."""
    from flux_cluster.launch import slurm
    from flux_cluster.launch.track import load_run

    run_dir, record = load_run(run, Path(runs_dir) if runs_dir is not None else None)
    if record.launcher != "slurm":
        raise FluxClusterError(f"{run_dir}: only Slurm runs can be requeued")
    slurm.requeue(record.job_ids)
    return list(record.job_ids)
