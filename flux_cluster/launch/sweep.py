"""Sweeps: one run per point of a grid of --set values (micro-batch x precision x checkpointing x compile x
nodes), a throughput job (or a train job) each, summarised in runs_summary.csv.

Every point's config is resolved before anything runs, so a bad value is one line naming the point.
Locally the points run one after the other. On Slurm every point gets its own run directory and job
script, and the points that ask for the same allocation (the same #SBATCH lines: in practice the same node
count) go out as one Slurm array, task i running point i's job script; the arrays all at once, or with
--max-parallel N each throttled to N tasks at a time (%N) and each waiting (afterany) for the one queued
before it, so at most N points are ever in Slurm at once. A point that fails or runs out of memory does
not stop the rest; --resume runs again only the points that have no answer (neither ok, oom nor 'not
converged').

The sweep's runner (run_sweep, then wait) is the only writer of sweep.json and runs_summary.csv, holding
the sweep's lock while it writes; view() (the report, the API's rows and best) reads the folder and the
points' run directories and writes nothing.
"""

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from flux_cluster.errors import FluxClusterError
from flux_cluster.launch.sweep_arrays import queue_points
from flux_cluster.launch.sweep_plan import (
    ONE_STEP_NOTE,
    SweepPlan,
    SweepRequest,
    check_sweep_dependency,
    plan_sweep,
    point_request,
    scales_batch,
)
from flux_cluster.launch.sweep_status import classify, reset, view
from flux_cluster.sweepdir import FINISHED, SWEEP_FILE, Point, SweepState

if TYPE_CHECKING:
    from rich.console import Console


LOCK_FILE = "sweep.lock"
"""Held by the process running the sweep (the only writer of its files), naming it."""


def create_sweep(request: SweepRequest, plan: SweepPlan | None = None) -> tuple[Path, SweepState]:
    """Check every point's config, then write the sweep folder with all points pending."""
    from flux_cluster.config.schema import PLAIN_NAME_PATTERN
    from flux_cluster.rundir import runs_root

    plan = plan or plan_sweep(request)
    base, points, slurm_points, grid = plan.base, plan.points, plan.slurm, request.grid
    name = request.name or f"sweep-{base.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not re.fullmatch(PLAIN_NAME_PATTERN, name):
        raise FluxClusterError(f"--name {name!r}: one name of letters, digits and _.- (no '/')")
    folder = (runs_root(request.runs_dir, base) / name).absolute()
    if slurm_points:
        from flux_cluster.launch.submit import check_slurm_path

        check_slurm_path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir()  # never into an existing folder: another sweep's, or a job's runs (runs/flux1)
    except FileExistsError:
        what = "a sweep of that name exists; --resume it" if (folder / SWEEP_FILE).exists() else "it exists"
        raise FluxClusterError(f"{folder}: {what}, or choose another --name") from None
    state = SweepState(
        name=name,
        system=request.system,
        job=request.job,
        grid=grid,
        overrides=list(request.overrides),
        synthetic=request.synthetic,
        max_parallel=request.max_parallel,
        here=request.here,
        created_at=time.time(),
        points=points,
        price_per_gpu_hour=base.price_per_gpu_hour or None,
        warmup_steps=request.warmup_steps,
        steps=request.steps,
    )
    state.save(folder)
    return folder, state


def find_sweep(spec: str | Path, runs_dir: Path | None = None, system: str | None = None) -> Path:
    """A sweep folder by path, or by name under the runs directory (the system's paths.log_root, if it
    sets one and no --runs-dir is given)."""
    from flux_cluster.rundir import runs_root

    config = None
    if system is not None:
        from flux_cluster.config import load_system

        config = load_system(system, []).config
    root = runs_root(runs_dir, config)
    for candidate in (Path(spec), root / str(spec)):
        if (candidate / SWEEP_FILE).is_file():
            return candidate.absolute()
    raise FluxClusterError(f"sweep {str(spec)!r}: no {SWEEP_FILE} there nor under {root}")


def start_sweep(request: SweepRequest, console: "Console | None" = None) -> Path:
    """create_sweep, then run_sweep: a new sweep's folder, its points run (local) or queued (Slurm)."""
    from flux_cluster.console import cli_console

    console = console or cli_console(stderr=True)
    plan = plan_sweep(request)
    folder, state = create_sweep(request, plan)
    console.print(f"[bold]sweep[/bold] {folder}: {len(state.points)} points of {', '.join(state.grid)}")
    if scales_batch(request):
        console.print(ONE_STEP_NOTE)
    run_sweep(folder, console, request.dependency)
    return folder


def run_sweep(folder: Path, console: "Console | None" = None, dependency: str | None = None) -> SweepState:
    """Run (locally) or queue (Slurm) every point that has no answer yet. Local: returns when all ended.
    dependency: Slurm, what the jobs queued now wait for."""
    from flux_cluster.console import cli_console

    console = console or cli_console(stderr=True)
    with _runner(folder):
        state = _update(folder)
        todo = [p for p in state.points if p.status not in FINISHED and p.status != "running"]
        if not todo:
            console.print(f"sweep {state.name}: every point has finished")
            return state
        here = _runs_here(state)
        if dependency is not None:
            check_sweep_dependency(dependency, not here, state.max_parallel)
        if here:
            return _run_here(folder, state, todo, console)
        return queue_points(folder, state, todo, console, dependency)


@contextmanager
def _runner(folder: Path) -> Iterator[None]:
    """Hold the sweep's lock: one process runs a sweep (and writes its files) at a time."""
    from flux_cluster.rundir import LockHeld, exclusive_lock

    try:
        lock = exclusive_lock(folder / LOCK_FILE)
    except LockHeld as held:
        raise FluxClusterError(
            f"sweep {folder}: another process is running it ({held.holder}); let it finish first"
        ) from None
    try:
        yield
    finally:
        if lock is not None:
            lock.close()


def _runs_here(state: SweepState) -> bool:
    from flux_cluster.config import load_system

    return state.here or load_system(state.system, list(state.overrides)).config.launcher == "local"


def _launch_point(folder: Path, state: SweepState, point: Point, console: "Console") -> int | None:
    """Run one point here; returns its exit code (None when it could not start)."""
    from flux_cluster.launch.submit import launch

    reset(point)
    point.status = "running"
    try:
        launched = launch(point_request(folder, state, point), console)
    except FluxClusterError as exc:  # e.g. its data root is missing: the others still go
        point.status, point.error = "failed", str(exc)
        return None
    point.run_dir = str(launched.run_dir)
    point.launcher = launched.record.launcher
    classify(point)
    return launched.exit_code


def _run_here(folder: Path, state: SweepState, todo: list[Point], console: "Console") -> SweepState:
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("sweep", total=len(todo), last="")
        for point in todo:
            bar.update(task, last=escape(f"point {point.index}: {point.label}"))
            exit_code = _launch_point(folder, state, point, console)
            state.save(folder)
            if exit_code is not None and exit_code < 0:  # the run was stopped (Ctrl-C, kill): so is the sweep
                raise FluxClusterError(
                    f"sweep {state.name} stopped at point {point.index} (its run was killed by signal "
                    f"{-exit_code}); go on with: flux-cluster sweep --resume {folder}"
                )
            bar.update(task, advance=1, last=escape(f"point {point.index}: {_outcome(point)}"))
    return state


def _outcome(point: Point) -> str:
    """Short enough for the progress line; the whole error is in the summary."""
    if point.status == "ok":
        return f"ok, {point.result.get('samples_per_s', 0):,.2f} samples/s"
    return point.status


def _update(folder: Path) -> SweepState:
    """view(), saved: only under the runner's lock."""
    state = view(folder)
    state.save(folder)
    return state


def wait(folder: Path, poll_s: float = 10.0) -> SweepState:
    """Until no point is running and no process is running the sweep; then the sweep's files brought up
    to date (unless another runner has started meanwhile: it writes them)."""
    from flux_cluster.rundir import lock_held

    while True:
        state = view(folder)
        if not any(p.status == "running" for p in state.points) and not lock_held(folder / LOCK_FILE):
            break
        time.sleep(poll_s)
    try:
        with _runner(folder):
            return _update(folder)
    except FluxClusterError:
        return view(folder)
