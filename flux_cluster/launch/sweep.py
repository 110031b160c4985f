"""Sweeps: one run per point of a grid of --set values (micro-batch x precision x checkpointing x compile x
nodes), a throughput job (or a train job) each, summarised in runs_summary.csv.

Every point's config is resolved before anything runs, so a bad value is one line naming the point.
Locally the points run one after the other; on Slurm each is a job of its own, all queued at once, or at
most --max-parallel at a time (point i starts after point i - N ended, whatever its outcome). A point
that fails or runs out of memory does not stop the rest; --resume runs again only the points that have
no answer (neither ok, oom nor 'not converged').
"""

import json
import re
import time
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING

from flux_cluster.errors import FluxClusterError
from flux_cluster.launch.sweep_state import FINISHED, SWEEP_FILE, THROUGHPUT_FILE, Point, SweepState

if TYPE_CHECKING:
    from rich.console import Console

SWEEP_JOBS = ("throughput", "train")
MAX_POINTS = 512
"""More points than this is a typo in a grid, not a sweep anyone queues."""


@dataclass(frozen=True)
class SweepRequest:
    """A sweep as the CLI or the API asks for it."""

    system: str
    grid: dict[str, list[str]]
    """Config key (as --set takes it, e.g. train.micro_batch_size, nodes) -> the values to try."""
    job: str = "throughput"
    overrides: list[str] = field(default_factory=list)
    """--set values every point shares."""
    synthetic: bool = False
    name: str | None = None
    """The sweep's folder under the runs directory; None: sweep-<system>-<time>."""
    runs_dir: Path | None = None
    here: bool = False
    """Run the points on this machine, one after the other, even on a Slurm system."""
    max_parallel: int | None = None
    """Slurm: at most this many points queued or running at once; None: all at once."""
    warmup_steps: int = 5
    steps: int = 20


def parse_grid(items: list[str]) -> dict[str, list[str]]:
    """--grid KEY=V1,V2,... (repeatable) as an ordered mapping; a bad item is one line naming it."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        parts = [v.strip() for v in values.split(",")]
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", key) or not all(parts):
            raise FluxClusterError(
                f"--grid {item!r}: expected KEY=VALUE1,VALUE2,... (e.g. train.compile=false,true)"
            )
        if key in grid:
            raise FluxClusterError(f"--grid {key}: given twice; list all its values in one --grid")
        if len(set(parts)) != len(parts):
            raise FluxClusterError(f"--grid {item!r}: a value is listed twice")
        grid[key] = parts
    if not grid:
        raise FluxClusterError("no --grid given: a sweep needs at least one KEY=VALUE1,VALUE2,...")
    return grid


def create_sweep(request: SweepRequest) -> tuple[Path, SweepState]:
    """Check every point's config, then write the sweep folder with all points pending."""
    from flux_cluster.config import load_system
    from flux_cluster.config.schema import PLAIN_NAME_PATTERN
    from flux_cluster.launch.rundir import runs_root
    from flux_cluster.training.workload import resolve_training

    if request.job not in SWEEP_JOBS:
        raise FluxClusterError(f"--job {request.job}: a sweep runs {' or '.join(SWEEP_JOBS)}")
    if request.synthetic and request.job != "throughput":
        raise FluxClusterError("--synthetic: only the throughput job takes it")
    grid = request.grid
    combos = list(product(*grid.values()))
    if len(combos) > MAX_POINTS:
        raise FluxClusterError(f"the grid has {len(combos)} points; at most {MAX_POINTS} (split the sweep)")
    points = [Point(index=i, values=dict(zip(grid, combo, strict=True))) for i, combo in enumerate(combos)]
    base = load_system(request.system, list(request.overrides)).config
    for point in points:
        try:
            overrides = point_overrides(request.overrides, point, request.here)
            resolve_training(load_system(request.system, overrides).config)  # both jobs train
        except FluxClusterError as exc:
            raise FluxClusterError(f"sweep point {point.index} ({point.label}): {exc}") from None
    name = request.name or f"sweep-{base.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not re.fullmatch(PLAIN_NAME_PATTERN, name):
        raise FluxClusterError(f"--name {name!r}: one name of letters, digits and _.- (no '/')")
    folder = (runs_root(request.runs_dir, base) / name).absolute()
    if base.launcher == "slurm" and not request.here:
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
    from flux_cluster.launch.rundir import runs_root

    config = None
    if system is not None:
        from flux_cluster.config import load_system

        config = load_system(system, []).config
    root = runs_root(runs_dir, config)
    for candidate in (Path(spec), root / str(spec)):
        if (candidate / SWEEP_FILE).is_file():
            return candidate.absolute()
    raise FluxClusterError(f"sweep {str(spec)!r}: no {SWEEP_FILE} there nor under {root}")


def run_sweep(folder: Path, console: "Console | None" = None) -> SweepState:
    """Run (locally) or queue (Slurm) every point that has no answer yet. Local: returns when all ended."""
    from flux_cluster.console import cli_console

    console = console or cli_console(stderr=True)
    state = refresh(folder)
    todo = [p for p in state.points if p.status not in FINISHED and p.status != "running"]
    if not todo:
        console.print(f"sweep {state.name}: every point has finished")
        return state
    if _runs_here(state):
        return _run_here(folder, state, todo, console)
    return _queue(folder, state, todo, console)


def point_overrides(shared: list[str], point: Point, here: bool) -> list[str]:
    """The --set values a point runs with: the sweep's, the point's, and launcher=local for --here."""
    return [*shared, *point.overrides, *(["launcher=local"] if here else [])]


def _runs_here(state: SweepState) -> bool:
    from flux_cluster.config import load_system

    return state.here or load_system(state.system, list(state.overrides)).config.launcher == "local"


def _point_request(folder: Path, state: SweepState, point: Point, dependency: str | None) -> "LaunchRequest":
    from flux_cluster.launch.submit import LaunchRequest, throughput_args

    job_args: tuple[str, ...] = ()
    if state.job == "throughput":
        job_args = throughput_args(state.warmup_steps or 0, state.steps or 1)
    return LaunchRequest(
        system=state.system,
        job=state.job,
        overrides=point_overrides(state.overrides, point, state.here),
        experiment=state.name,
        runs_dir=folder.parent,
        dependency=dependency,
        job_args=job_args,
        synthetic=state.synthetic,
        run_name=f"p{point.index:03d}",
        echo=False,
    )


def _launch_point(
    folder: Path, state: SweepState, point: Point, console: "Console", dependency: str | None
) -> int | None:
    """Launch one point; returns a local run's exit code (None on Slurm)."""
    from flux_cluster.launch.submit import launch

    request = _point_request(folder, state, point, dependency)
    point.status, point.error, point.result, point.job_ids = "running", None, {}, []
    point.run_dir = point.launcher = None
    try:
        launched = launch(request, console)
    except FluxClusterError as exc:  # e.g. sbatch refused this point: the others still go
        point.status, point.error = "failed", str(exc)
        return None
    point.run_dir = str(launched.run_dir)
    point.launcher = launched.record.launcher
    point.job_ids = list(launched.record.job_ids)
    if launched.exit_code is not None:
        _classify(point)
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
            exit_code = _launch_point(folder, state, point, console, None)
            state.save(folder)
            if exit_code is not None and exit_code < 0:  # the run was stopped (Ctrl-C, kill): so is the sweep
                raise FluxClusterError(
                    f"sweep {state.name} stopped at point {point.index} (its run was killed by signal "
                    f"{-exit_code}); go on with: flux-cluster sweep --resume {folder}"
                )
            bar.update(task, advance=1, last=escape(f"point {point.index}: {_outcome(point)}"))
    return state


def _queue(folder: Path, state: SweepState, todo: list[Point], console: "Console") -> SweepState:
    """Submit the points; with --max-parallel N a point waits (afterany) for the N-th job submitted
    before it, the points still queued or running from an earlier submission counted first, so at most N
    are ever in Slurm at once. A point sbatch refused takes no place in that chain."""
    window = state.max_parallel
    chain = [_base_id(p) for p in state.points if p.status == "running" and p.job_ids]
    for point in todo:
        dependency = f"afterany:{chain[-window]}" if window and len(chain) >= window else None
        _launch_point(folder, state, point, console, dependency)
        if point.job_ids:
            chain.append(_base_id(point))
        state.save(folder)
    limit = f", at most {window} at once" if window else ""
    console.print(
        f"sweep {state.name}: {len(todo)} points queued{limit}; follow it: "
        f"flux-cluster sweep --resume {folder} --wait, or flux-cluster report {folder}",
        markup=False,
        highlight=False,
    )
    return state


def _base_id(point: Point) -> str:
    """The job id a dependency names: an array's base id, so it waits for every task."""
    return point.job_ids[0].split("_")[0]


def _outcome(point: Point) -> str:
    """Short enough for the progress line; the whole error is in the summary."""
    if point.status == "ok":
        return f"ok, {point.result.get('samples_per_s', 0):,.2f} samples/s"
    return point.status


def refresh(folder: Path) -> SweepState:
    """The sweep as it stands now: each running point's state read again from its run directory (and
    Slurm); the sweep file and the summary rewritten."""
    state = SweepState.load(folder)
    changed = False
    for point in state.points:
        if point.status == "running" and point.run_dir:
            _classify(point)
            changed = True
    if changed:
        state.save(folder)
    return state


def wait(folder: Path, poll_s: float = 10.0) -> SweepState:
    """Refresh until no point is running."""
    while True:
        state = refresh(folder)
        if not any(p.status == "running" for p in state.points):
            return state
        time.sleep(poll_s)


def _classify(point: Point) -> None:
    """A point's status and figures from its run directory: the throughput record, else the job's state."""
    from flux_cluster.launch.rundir import RunRecord
    from flux_cluster.launch.track import is_final, run_states

    assert point.run_dir is not None
    run_dir = Path(point.run_dir)
    record_file = run_dir / "results" / THROUGHPUT_FILE
    if record_file.is_file():
        try:
            result = json.loads(record_file.read_text())
        except (OSError, ValueError) as exc:
            point.status, point.error = "failed", f"{record_file}: unreadable ({exc})"
            return
        point.result = result if isinstance(result, dict) else {}
        point.status = str(point.result.get("status", "failed"))
        point.error = point.result.get("error")
        return
    record = RunRecord.load(run_dir)
    states = run_states(run_dir, record) if record is not None else {}
    if not states or not all(is_final(s) for s in states.values()):
        point.status = "running"
        return
    if _train_figures(point, run_dir):
        return
    if all(s == "COMPLETED" for s in states.values()):
        point.status, point.error = "failed", "the job ended without writing its record"
    else:
        point.status, point.error = _failure(run_dir, states)


def _train_figures(point: Point, run_dir: Path) -> bool:
    """A train job's point: its figures from the result log (throughput, MFU) and the fine-tuning summary."""
    log = run_dir / "results" / "result_0.txt"
    if not log.is_file():
        return False
    from flux_cluster.report.harvest import harvest_run

    result = harvest_run(log)
    if result.status not in ("success", "aborted"):
        return False
    point.status = "ok" if result.status == "success" else "not converged"
    point.result = {
        "samples_per_s": result.throughput_samples_per_s,
        "samples_per_s_per_gpu": result.throughput_per_accelerator,
        "mfu": result.mfu,
        "world_size": result.accelerators,
        "wall_s": result.minutes * 60 if result.minutes else None,
    }
    return True


def _failure(run_dir: Path, states: dict[str, str]) -> tuple[str, str]:
    """('oom' or 'failed', the reason): an out-of-memory in the log makes it oom even without a record
    (a train job, or a rank the OOM killed before it wrote)."""
    from flux_cluster.launch.rundir import RunRecord
    from flux_cluster.launch.track import log_files

    record = RunRecord.load(run_dir)
    text = ""
    if record is not None:
        for path in log_files(run_dir, record) + log_files(run_dir, record, stderr=True):
            if path.is_file():
                text += path.read_bytes()[-65536:].decode(errors="replace")
    if "OutOfMemoryError" in text or "out of memory" in text.lower():
        return "oom", "out of memory (see the run's log)"
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("error")]
    reason = lines[-1] if lines else ", ".join(sorted(set(states.values())))
    return "failed", reason[:300]


if TYPE_CHECKING:
    from flux_cluster.launch.submit import LaunchRequest
