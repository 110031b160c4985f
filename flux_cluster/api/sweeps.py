"""Sweeps: plan, start and open a grid of runs, and their table of points."""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flux_cluster.errors import FluxClusterError
from flux_cluster.sweepdir import SweepState, summary_rows

if TYPE_CHECKING:
    from flux_cluster.launch.sweep_plan import SweepPlan, SweepRequest
    from flux_cluster.report.sweep import SweepReport


@dataclass
class Sweep:
    """A sweep folder (runs/<sweep>/): its points, their states and figures."""

    folder: Path

    def state(self) -> SweepState:
        """The points as they stand now (running ones read again from their run directories); reads
        only: the sweep's runner is the one writer of its files."""
        from flux_cluster.launch.sweep_status import view

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
        from flux_cluster.launch.sweep_status import sweep_report

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
    from flux_cluster.launch.sweep import start_sweep

    request = _sweep_request(
        system,
        grid,
        job,
        overrides,
        synthetic=synthetic,
        name=name,
        runs_dir=runs_dir,
        here=here,
        submit=submit,
        max_parallel=max_parallel,
        dependency=dependency,
        warmup_steps=warmup_steps,
        steps=steps,
    )
    return Sweep(start_sweep(request))


def plan_sweep(
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
) -> "SweepPlan":
    """What sweep() with these arguments would run, every point's config checked (flux-cluster sweep
    --dry-run); nothing written, nothing submitted."""
    from flux_cluster.launch.sweep_plan import plan_sweep as plan

    request = _sweep_request(
        system,
        grid,
        job,
        overrides,
        synthetic=synthetic,
        name=name,
        runs_dir=runs_dir,
        here=here,
        submit=submit,
        max_parallel=max_parallel,
        dependency=dependency,
        warmup_steps=warmup_steps,
        steps=steps,
    )
    return plan(request)


def _sweep_request(
    system: str,
    grid: Mapping[str, Iterable[Any]] | Sequence[str],
    job: str,
    overrides: Sequence[str],
    *,
    synthetic: bool,
    name: str | None,
    runs_dir: Path | str | None,
    here: bool,
    submit: bool,
    max_parallel: int | None,
    dependency: str | None,
    warmup_steps: int,
    steps: int,
) -> "SweepRequest":
    from flux_cluster.launch.sweep_plan import SweepRequest, parse_grid

    return SweepRequest(
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


def open_sweep(spec: str | Path, runs_dir: Path | str | None = None, system: str | None = None) -> Sweep:
    """An existing sweep folder, by path or by name under the runs directory (or the system's
    paths.log_root)."""
    from flux_cluster.launch.sweep import find_sweep

    return Sweep(find_sweep(spec, Path(runs_dir) if runs_dir is not None else None, system))


def _grid_mapping(grid: Mapping[str, Iterable[Any]]) -> dict[str, list[str]]:
    """{key: values} as a grid: each key a config key's name, each value one value (a string holding a
    comma stays one), read no further than a grid may be long; a bad key or value is one line."""
    from itertools import islice

    from flux_cluster.launch.sweep_plan import MAX_POINTS, check_grid

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
