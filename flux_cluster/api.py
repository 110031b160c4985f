"""flux-cluster from Python: the library under the CLI's submit, preflight, status/logs/cancel, sweep and
report commands (which are thin wrappers over it). Importing this module imports no torch.

    from flux_cluster import api

    best = api.sweep("local", {"train.micro_batch_size": [1, 2, 4, 8]}, synthetic=True).best()
    run = api.submit("dgx_h100x8", overrides=["train.compile=true"])   # -> Run
    run.wait(); print(run.status(), run.logs()[-2000:])
    print(api.report([run.run_dir]).to_json())

Errors are flux_cluster.errors.FluxClusterError, one line each (the CLI prints them as 'error: ...');
report() finding no result logs is its subclass NoResultsError.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flux_cluster.errors import FluxClusterError, NoResultsError
from flux_cluster.launch.rundir import SCRIPT_FILE, RunRecord
from flux_cluster.launch.sweep_state import THROUGHPUT_FILE, SweepState, summary_rows

if TYPE_CHECKING:
    from flux_cluster.config.schema import SystemConfig
    from flux_cluster.launch.submit import LaunchRequest
    from flux_cluster.report.build import Tracker
    from flux_cluster.report.scoring import GroupResult
    from flux_cluster.report.sweep import SweepReport

__all__ = [
    "FluxClusterError",
    "NoResultsError",
    "Report",
    "Run",
    "Sweep",
    "load_system",
    "open_run",
    "open_sweep",
    "preflight",
    "report",
    "submit",
    "sweep",
]


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

    def states(self) -> dict[str, str]:
        """Job (array task) id -> its Slurm state; a local run: {'local': COMPLETED/RUNNING/FAILED (...)}."""
        from flux_cluster.launch.track import run_states

        return run_states(self.run_dir, self.record)

    def status(self) -> str:
        """One word for the whole run: the jobs' states, joined when they differ."""
        return ", ".join(sorted(set(self.states().values())))

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
        return (self.run_dir / SCRIPT_FILE).read_text()

    def logs(self, stderr: bool = False) -> str:
        """The jobs' output so far, every job's in turn."""
        from flux_cluster.launch.track import log_files

        parts = [
            p.read_text(errors="replace") for p in log_files(self.run_dir, self.record, stderr) if p.is_file()
        ]
        return "".join(parts)

    def cancel(self) -> str:
        from flux_cluster.launch.track import cancel_run

        return cancel_run(self.run_dir, self.record)

    def throughput(self) -> dict[str, Any] | None:
        """A throughput job's record (results/throughput.json), None until it is written."""
        import json

        path = self.run_dir / "results" / THROUGHPUT_FILE
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
    from flux_cluster.launch.submit import LaunchRequest, throughput_args

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
        job_args=throughput_args(warmup_steps, steps) if job == "throughput" else (),
        synthetic=synthetic,
        echo=echo,
    )
    return _launch(request)


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
    from flux_cluster.launch.submit import LaunchRequest

    soak = soak_seconds > 0
    request = LaunchRequest(
        system=system,
        job="preflight",
        overrides=list(overrides),
        nexp=nexp,
        seed=seed,
        experiment=experiment,
        runs_dir=Path(runs_dir) if runs_dir is not None else None,
        dependency=dependency,
        dry_run=dry_run,
        job_args=("--soak-seconds", f"{soak_seconds:g}") if soak else (),
        extra_minutes=int(soak_seconds // 60) + 1 if soak else 0,
        echo=echo,
    )
    return _launch(request)


def _launch(request: "LaunchRequest") -> Run:
    from flux_cluster.launch.submit import launch

    launched = launch(request)
    return Run(launched.run_dir, launched.exit_code)


def open_run(run: str | Path | None = None, runs_dir: Path | str | None = None) -> Run:
    """An existing run: a path, '<experiment>/<name>', a unique suffix, or None for the latest."""
    from flux_cluster.launch.track import load_run

    run_dir, _ = load_run(run, Path(runs_dir) if runs_dir is not None else None)
    return Run(run_dir.absolute())  # the same run after a chdir


@dataclass
class Sweep:
    """A sweep folder (runs/<sweep>/): its points, their states and figures."""

    folder: Path

    def state(self) -> SweepState:
        """The points as they stand now (running ones read again from their run directories); reads
        only: the sweep's runner is the one writer of its files."""
        from flux_cluster.launch.sweep import view

        return view(self.folder)

    def rows(self) -> list[dict[str, Any]]:
        """runs_summary.csv's rows, as numbers and strings."""
        return summary_rows(self.state())

    def wait(self, poll_s: float = 10.0) -> SweepState:
        """Until every point has ended (local sweeps have when sweep() returns)."""
        from flux_cluster.launch.sweep import wait

        return wait(self.folder, poll_s)

    def resume(self, dependency: str | None = None) -> "Sweep":
        """Run again the points that have no answer (not ok, oom or 'not converged'), with the sweep's own
        grid and settings. dependency: Slurm, what the points queued now wait for."""
        from flux_cluster.launch.sweep import run_sweep

        run_sweep(self.folder, dependency=dependency)
        return self

    def report(self) -> "SweepReport":
        from flux_cluster.report.sweep import sweep_report

        return sweep_report(self.folder)

    def best(self) -> dict[str, Any] | None:
        """The fastest point that ran (status ok), by samples/s; None if none did."""
        ok = [r for r in self.rows() if r["status"] == "ok" and r["samples_per_s"] is not None]
        return max(ok, key=lambda r: r["samples_per_s"], default=None)


def sweep(
    system: str,
    grid: Mapping[str, Iterable[Any]] | Sequence[str],
    job: str = "throughput",
    overrides: Sequence[str] = (),
    *,
    synthetic: bool = False,
    name: str | None = None,
    runs_dir: Path | str | None = None,
    here: bool = False,
    submit: bool = False,
    max_parallel: int | None = None,
    dependency: str | None = None,
    warmup_steps: int = 5,
    steps: int = 20,
) -> Sweep:
    """flux-cluster sweep. grid: {key: [values]} (a key is a config key's name; each item is one value, a
    Python value or a string, commas included) or ['KEY=V1,V2', ...] as --grid takes them.
    Local (or here): returns when every point has ended; Slurm (submit: insist on it): once all are
    queued, points sharing a node count as one array (Sweep.wait()). dependency: Slurm, what the sweep's
    jobs wait for (afterok:JOBID)."""
    from flux_cluster.launch.sweep import SweepRequest, parse_grid, start_sweep

    request = SweepRequest(
        system=system,
        grid=_grid_mapping(grid) if isinstance(grid, Mapping) else parse_grid(list(grid)),
        job=job,
        overrides=list(overrides),
        synthetic=synthetic,
        name=name,
        runs_dir=Path(runs_dir) if runs_dir is not None else None,
        here=here,
        max_parallel=max_parallel,
        warmup_steps=warmup_steps,
        steps=steps,
        submit=submit,
        dependency=dependency,
    )
    return Sweep(start_sweep(request))


def open_sweep(spec: str | Path, runs_dir: Path | str | None = None, system: str | None = None) -> Sweep:
    """An existing sweep folder, by path or by name under the runs directory (or the system's
    paths.log_root)."""
    from flux_cluster.launch.sweep import find_sweep

    return Sweep(find_sweep(spec, Path(runs_dir) if runs_dir is not None else None, system))


def _grid_mapping(grid: Mapping[str, Iterable[Any]]) -> dict[str, list[str]]:
    """{key: values} as a grid: each key a config key's name, each value one value (a string holding a
    comma stays one), read no further than a grid may be long; a bad key or value is one line."""
    from itertools import islice

    from flux_cluster.launch.sweep import MAX_POINTS, check_grid

    checked: dict[str, list[str]] = {}
    for key, values in grid.items():
        if not isinstance(key, str):
            raise FluxClusterError(f"grid key {key!r}: expected a config key's name (a string)")
        if isinstance(values, str | bytes) or not isinstance(values, Iterable):
            raise FluxClusterError(
                f"grid {key[:80]!r}: expected a list of values, got {type(values).__name__}"
            )
        items = list(islice(values, MAX_POINTS + 1))
        if len(items) > MAX_POINTS:
            raise FluxClusterError(f"grid {key[:80]!r}: more than {MAX_POINTS} values (split the sweep)")
        checked[key] = [_set_value(v) for v in items]
    return check_grid(checked, "grid")


def _set_value(value: Any) -> str:
    """A Python value as --set writes it (YAML): True -> true."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass
class Report:
    """What flux-cluster report computes, as typed objects: scored groups of result logs and sweeps."""

    groups: "list[GroupResult]" = field(default_factory=list)
    sweeps: "list[SweepReport]" = field(default_factory=list)
    comparison: dict[str, Any] | None = None
    """report(compare=(A, B)): the B/A ratios of matched groups (groups holds A's, then B's)."""

    def to_json(self) -> dict[str, Any]:
        """The document 'flux-cluster report --format json' writes (a sweep's when the paths are sweeps)."""
        from flux_cluster.report.formats import finite_for_json, to_document

        if self.sweeps:
            from flux_cluster.report.sweep import sweep_document

            return sweep_document(self.sweeps)
        return finite_for_json(to_document(self.groups, self.comparison))


def report(
    paths: Sequence[Path | str] = (),
    *,
    check: bool = True,
    ruleset: str | None = None,
    price: float | None = None,
    prices: Mapping[str, float] | None = None,
    peak_tflops: float | None = None,
    target: float | None = None,
    compare: tuple[Path | str, Path | str] | None = None,
    progress: "Tracker | None" = None,
    check_timeout: float | None = None,
) -> Report:
    """flux-cluster report PATHS: result logs scored as MLPerf does, fine-tuning and evaluation figures,
    or sweep folders' points (read only: a running sweep's files are its runner's to write).
    compare=(A, B): A's and B's groups with B/A ratios (give no paths). target: the quality target for
    logs that name none. progress: told the work to do, then each unit done. check_timeout: seconds one
    log's compliance check may take (None: the default). No result logs under a path: NoResultsError."""
    from flux_cluster.launch.sweep_state import is_sweep_folder

    roots = [Path(p) for p in paths]
    if compare is not None:
        if roots:
            raise FluxClusterError("--compare A B takes its two paths itself: give no other paths")
    elif not roots:
        raise FluxClusterError("report: no paths given")
    elif any(is_sweep_folder(p) for p in roots):
        from flux_cluster.report.sweep import sweep_reports

        return Report(sweeps=sweep_reports(roots))  # other paths among them: one error line
    from flux_cluster.mlperf_rules import QUALITY_TARGET
    from flux_cluster.report.build import Options, build

    options = Options(
        check=check,
        ruleset=ruleset,
        price=price,
        prices=dict(prices or {}),
        peak_tflops=peak_tflops,
        target=QUALITY_TARGET if target is None else target,
        **({} if check_timeout is None else {"check_timeout": check_timeout}),
    )

    def harvest(where: list[Path]) -> "list[GroupResult]":
        for root in where:
            if not root.exists():
                raise FluxClusterError(f"{root}: no such file or directory")
        groups = build(where, options, progress)
        if not groups:
            places = ", ".join(str(r) for r in where)
            raise NoResultsError(
                "no MLPerf result logs (files with :::MLLOG lines) and no flux-cluster evaluate results "
                f"under {places}"
            )
        return groups

    if compare is None:
        return Report(groups=harvest(roots))
    from flux_cluster.report.compare import compare as compare_groups

    a_root, b_root = Path(compare[0]), Path(compare[1])
    a, b = harvest([a_root]), harvest([b_root])
    return Report(groups=[*a, *b], comparison=compare_groups(a_root, a, b_root, b))
