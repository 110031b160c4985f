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

import json
import math
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING

from flux_cluster.errors import FluxClusterError
from flux_cluster.launch.sweep_state import FINISHED, SWEEP_FILE, THROUGHPUT_FILE, Point, SweepState

if TYPE_CHECKING:
    from rich.console import Console

    from flux_cluster.config import SystemConfig
    from flux_cluster.launch.plan import JobPlan
    from flux_cluster.launch.submit import LaunchRequest

SWEEP_JOBS = ("throughput", "train")
MAX_POINTS = 512
"""More points than this is a typo in a grid, not a sweep anyone queues."""
LOCK_FILE = "sweep.lock"
"""Held by the process running the sweep (the only writer of its files), naming it."""
ARRAYS_DIR = "arrays"
"""The sweep's Slurm arrays: <stamp>-nodes<N>/ with the array's script and Slurm's output files."""
ARRAY_SCRIPT = "array.sh"


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
    submit: bool = False
    """Submit to Slurm, and say so if the system has no Slurm (without it, the system's launcher decides)."""
    dependency: str | None = None
    """Slurm: the sweep's first jobs wait for this (afterok:JOBID ...); not kept for --resume."""


GRID_KEY_PATTERN = r"[A-Za-z_][A-Za-z0-9_.]*"
"""A grid key is a config key as --set takes it (train.micro_batch_size, nodes, env.NCCL_ALGO)."""


def parse_grid(items: list[str]) -> dict[str, list[str]]:
    """--grid KEY=V1,V2,... (repeatable) as an ordered mapping; a bad item is one line naming it."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        parts = [v.strip() for v in values.split(",")]
        if not sep or not re.fullmatch(GRID_KEY_PATTERN, key) or not all(parts):
            raise FluxClusterError(
                f"--grid {_short(item)}: expected KEY=VALUE1,VALUE2,... (e.g. train.compile=false,true)"
            )
        if key in grid:
            raise FluxClusterError(f"--grid {key}: given twice; list all its values in one --grid")
        grid[key] = parts
    return check_grid(grid, "--grid")


def check_grid(grid: dict[str, list[str]], where: str) -> dict[str, list[str]]:
    """A grid whose keys are names and whose values are distinct, with at most MAX_POINTS points, counted
    before any point is made (4 keys of 100 values would be 10^8 points)."""
    if not grid:
        raise FluxClusterError(f"no {where} given: a sweep needs at least one KEY=VALUE1,VALUE2,...")
    for key, values in grid.items():
        if not re.fullmatch(GRID_KEY_PATTERN, key):
            raise FluxClusterError(
                f"{where} key {_short(key)}: expected a config key (e.g. train.micro_batch_size), "
                "its values in a list"
            )
        if not values or not all(values):
            raise FluxClusterError(f"{where} {key}: expected a list of non-empty values")
        if len(set(values)) != len(values):
            raise FluxClusterError(f"{where} {key}: a value is listed twice")
    count = math.prod(len(values) for values in grid.values())
    if count > MAX_POINTS:
        raise FluxClusterError(f"the grid has {count} points; at most {MAX_POINTS} (split the sweep)")
    return grid


def _short(text: str, limit: int = 80) -> str:
    """A piece of a command line in an error line: quoted, control characters escaped, and cut."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


ONE_STEP_NOTE = (
    "global batch per point: micro_batch_size x ranks (one step, no gradient accumulation); "
    "--set train.global_batch_size=N to fix it"
)
"""What a throughput sweep without a global batch does, as its printed plan says it."""


def scales_batch(request: SweepRequest) -> bool:
    """A throughput sweep needs no global batch: each point trains one step's worth, unless the grid or
    --set gives train.global_batch_size."""
    key = "train.global_batch_size"
    given = key in request.grid or any(item.split("=", 1)[0].strip() == key for item in request.overrides)
    return request.job == "throughput" and not given


def one_step_batch(config: "SystemConfig") -> list[str]:
    """--set values giving a point the global batch of one step (micro_batch_size x ranks). A size
    without a learning-rate preset gets the workload's default preset's rate and warmup where the config
    sets none: they change no step's time."""
    from flux_cluster.training.workload import load_workload

    train = config.train
    gbs = train.micro_batch_size * config.nodes * config.gpus_per_node
    derived = [f"train.global_batch_size={gbs}"]
    workload, _ = load_workload(train.benchmark)
    if workload.mlperf is not None and gbs not in workload.batch_presets:
        preset = workload.batch_presets.get(workload.mlperf.global_batch_size)
        if preset is not None and train.learning_rate is None:
            derived.append(f"train.learning_rate={preset.learning_rate}")
        if preset is not None and train.warmup_steps is None:
            derived.append(f"train.warmup_steps={preset.warmup_steps}")
    return derived


@dataclass
class SweepPlan:
    """A sweep checked point by point, before its folder exists (what --dry-run prints)."""

    request: SweepRequest
    base: "SystemConfig"
    points: list[Point]
    slurm: bool
    """The points go to Slurm (as arrays), not one after the other here."""
    ranks: list[int]
    global_batch: list[int]
    """Per point: its ranks and its global batch size, as its job will run."""


def plan_sweep(request: SweepRequest) -> SweepPlan:
    """Every point's config resolved and checked (a bad value is one line naming the point); nothing
    written."""
    from flux_cluster.config import load_system
    from flux_cluster.training.workload import resolve_training

    if request.job not in SWEEP_JOBS:
        raise FluxClusterError(f"--job {request.job}: a sweep runs {' or '.join(SWEEP_JOBS)}")
    if request.synthetic and request.job != "throughput":
        raise FluxClusterError("--synthetic: only the throughput job takes it")
    if request.submit and request.here:
        raise FluxClusterError("--submit and --here: choose one (Slurm jobs, or this machine)")
    # the CLI's options check these too; the API comes here directly
    for option, value, least in (
        ("--max-parallel", request.max_parallel, 1),
        ("--steps", request.steps, 1),
        ("--warmup-steps", request.warmup_steps, 0),
    ):
        if value is not None and value < least:
            raise FluxClusterError(f"{option}: got {value}, expected at least {least}")
    grid = check_grid(request.grid, "--grid")  # counted before a single point is made
    points = [
        Point(index=i, values=dict(zip(grid, combo, strict=True)))
        for i, combo in enumerate(product(*grid.values()))
    ]
    base = load_system(request.system, list(request.overrides)).config
    if request.submit:
        from flux_cluster.launch.submit import require_slurm

        require_slurm(base)
    slurm_points = base.launcher == "slurm" and not request.here
    if request.dependency is not None:
        _check_dependency(request.dependency, slurm_points)
    scale = scales_batch(request)
    ranks, global_batch = [], []
    for point in points:
        try:
            config = load_system(
                request.system, point_overrides(request.overrides, point, request.here)
            ).config
            if scale:
                point.derived = one_step_batch(config)
                config = load_system(
                    request.system, point_overrides(request.overrides, point, request.here)
                ).config
            training = resolve_training(config)  # both jobs train
            mlperf = config.mlperf
            if slurm_points and request.job == "train" and mlperf.nexp > 1 and mlperf.nexp_mode == "array":
                raise FluxClusterError(
                    f"mlperf.nexp={mlperf.nexp} with nexp_mode array: a sweep's points are array tasks "
                    "themselves; use --set mlperf.nexp_mode=serial"
                )
        except FluxClusterError as exc:
            raise FluxClusterError(f"sweep point {point.index} ({point.label}): {exc}") from None
        ranks.append(training.world_size)
        global_batch.append(training.train.global_batch_size or 0)
    return SweepPlan(request, base, points, slurm_points, ranks, global_batch)


def print_plan(plan: SweepPlan, console: "Console") -> None:
    """The points as they will run: values, ranks, global batch (and how it was chosen)."""
    from rich.table import Table

    from flux_cluster.console import print_table
    from flux_cluster.safe_text import markup_escape as escape

    request = plan.request
    where = "Slurm arrays (one per node count)" if plan.slurm else "this machine, one after the other"
    console.print(
        f"[bold]sweep plan[/bold]: {len(plan.points)} {escape(request.job)} points on "
        f"{escape(plan.base.name)}, run on {where}"
    )
    if scales_batch(request):
        console.print(ONE_STEP_NOTE)
    table = Table(box=None)
    for column in ("point", *request.grid, "ranks", "global batch"):
        table.add_column(escape(column))
    for point, ranks, gbs in zip(plan.points, plan.ranks, plan.global_batch, strict=True):
        table.add_row(str(point.index), *(escape(v) for v in point.values.values()), str(ranks), str(gbs))
    print_table(console, table)


def create_sweep(request: SweepRequest, plan: SweepPlan | None = None) -> tuple[Path, SweepState]:
    """Check every point's config, then write the sweep folder with all points pending."""
    from flux_cluster.config.schema import PLAIN_NAME_PATTERN
    from flux_cluster.launch.rundir import runs_root

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
            _check_dependency(dependency, not here)
        if here:
            return _run_here(folder, state, todo, console)
        return _queue(folder, state, todo, console, dependency)


def _check_dependency(dependency: str, slurm_points: bool) -> None:
    from flux_cluster.launch.plan import check_dependency

    if not slurm_points:
        raise FluxClusterError(f"--dependency {dependency}: the points run on this machine, not in Slurm")
    check_dependency(dependency)


@contextmanager
def _runner(folder: Path) -> Iterator[None]:
    """Hold the sweep's lock: one process runs a sweep (and writes its files) at a time."""
    from flux_cluster.launch.rundir import LockHeld, exclusive_lock

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


def point_overrides(shared: list[str], point: Point, here: bool) -> list[str]:
    """The --set values a point runs with: the sweep's, the point's, and launcher=local for --here."""
    return [*shared, *point.overrides, *(["launcher=local"] if here else [])]


def _runs_here(state: SweepState) -> bool:
    from flux_cluster.config import load_system

    return state.here or load_system(state.system, list(state.overrides)).config.launcher == "local"


def _point_request(folder: Path, state: SweepState, point: Point) -> "LaunchRequest":
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
        job_args=job_args,
        synthetic=state.synthetic,
        run_name=f"p{point.index:03d}",
        echo=False,
    )


def _reset(point: Point) -> None:
    point.status, point.error, point.result, point.job_ids = "pending", None, {}, []
    point.run_dir = point.launcher = None


def _launch_point(folder: Path, state: SweepState, point: Point, console: "Console") -> int | None:
    """Run one point here; returns its exit code (None when it could not start)."""
    from flux_cluster.launch.submit import launch

    _reset(point)
    point.status = "running"
    try:
        launched = launch(_point_request(folder, state, point), console)
    except FluxClusterError as exc:  # e.g. its data root is missing: the others still go
        point.status, point.error = "failed", str(exc)
        return None
    point.run_dir = str(launched.run_dir)
    point.launcher = launched.record.launcher
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
            exit_code = _launch_point(folder, state, point, console)
            state.save(folder)
            if exit_code is not None and exit_code < 0:  # the run was stopped (Ctrl-C, kill): so is the sweep
                raise FluxClusterError(
                    f"sweep {state.name} stopped at point {point.index} (its run was killed by signal "
                    f"{-exit_code}); go on with: flux-cluster sweep --resume {folder}"
                )
            bar.update(task, advance=1, last=escape(f"point {point.index}: {_outcome(point)}"))
    return state


def _queue(
    folder: Path, state: SweepState, todo: list[Point], console: "Console", dependency: str | None
) -> SweepState:
    """Write every point's run directory, then submit the points that ask for the same allocation as one
    array. With --max-parallel N each array runs at most N tasks at once (%N), and an array waits
    (afterany) for the oldest arrays queued before it (those of an earlier submission included) only as
    far as needed to keep at most N points running: arrays that fit in N together run side by side. A
    point that cannot be prepared, or whose array sbatch refused, is failed with the reason and takes no
    place in the window."""
    from flux_cluster.launch.render import allocation
    from flux_cluster.launch.submit import plan_launch, write_run

    window = state.max_parallel
    # (array id, how many of its tasks may run at once), oldest first: what a new array may have to wait for
    running: list[tuple[str, int]] = []
    for point in state.points:
        if point.status == "running" and point.job_ids:
            running.append((_base_id(point), 1))
    in_slurm = _merge_counts(running, window)
    groups: dict[tuple[str, ...], list[tuple[Point, JobPlan]]] = {}
    for point in todo:
        _reset(point)
        try:
            plan, training = plan_launch(_point_request(folder, state, point), console)
            write_run(plan, training)
        except FluxClusterError as exc:  # e.g. a data root missing: the others still go
            point.status, point.error = "failed", str(exc)
            continue
        point.run_dir, point.launcher = str(plan.run_dir), "slurm"
        groups.setdefault(allocation(plan), []).append((point, plan))
    state.save(folder)
    arrays = 0
    for group in groups.values():
        after = [dependency] if dependency else []
        width = min(len(group), window) if window else len(group)
        before = list(in_slurm)
        waits = make_room(in_slurm, width, window)
        if waits:
            after.append("afterany:" + ":".join(waits))
        base_id = _submit_array(folder, state, group, ",".join(after) or None, console)
        if base_id is None:  # refused: it takes no place, and what it would have waited for still runs
            in_slurm[:] = before
        else:
            in_slurm.append((base_id, width))
            arrays += 1
        state.save(folder)
    queued = sum(1 for p in todo if p.job_ids)
    limit = f", at most {window} at once" if window else ""
    refused = f"; {len(todo) - queued} failed to queue (see runs_summary.csv)" if queued < len(todo) else ""
    console.print(
        f"sweep {state.name}: {queued} points queued as {arrays} Slurm array(s){limit}{refused}; follow "
        f"it: flux-cluster sweep --resume {folder} --wait, or flux-cluster report {folder}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return state


def _submit_array(
    folder: Path,
    state: SweepState,
    group: "list[tuple[Point, JobPlan]]",
    dependency: str | None,
    console: "Console",
) -> str | None:
    """sbatch one array for the group's points (task i: the i-th point); its task ids go to each point's
    jobs.json, and each point's slurm/ links to its task's output. Returns the array's id, or None when
    sbatch refused it (its points failed, with the reason)."""
    from flux_cluster.atomic import write_atomic
    from flux_cluster.launch import slurm
    from flux_cluster.launch.plan import ArrayPlan
    from flux_cluster.launch.render import render_array
    from flux_cluster.launch.rundir import RunRecord, create_run_dir
    from flux_cluster.launch.submit import warn_if_image_missing

    first = group[0][1]
    plan = ArrayPlan(
        first=first,
        run_dirs=tuple(p.run_dir for _, p in group),
        folder=create_run_dir(folder, ARRAYS_DIR, f"nodes{first.system.nodes}"),
        name=state.name,
        throttle=state.max_parallel,
        dependency=dependency,
    )
    script = render_array(plan)
    write_atomic(plan.folder / ARRAY_SCRIPT, script, mode=0o755)
    plan.slurm_dir.mkdir(exist_ok=True)  # Slurm opens --output there before the script starts
    warn_if_image_missing(first.system, console)
    try:
        base_id = slurm.submit_script(script, plan.slurm_dir)
    except FluxClusterError as exc:
        for point, _ in group:
            point.status, point.error = "failed", str(exc)
        return None
    submitted = time.time()
    for task, (point, _) in enumerate(group):  # recorded at once: a --resume must never queue them again
        point.job_ids, point.status = [f"{base_id}_{task}"], "running"
    state.save(folder)
    for point, point_plan in group:
        (job_id,) = point.job_ids
        RunRecord(launcher="slurm", job_ids=[job_id], submitted_at=submitted).save(point_plan.run_dir)
        for stream in (False, True):  # the task's output, where 'flux-cluster logs RUN' looks for it
            target = slurm.log_path(job_id, plan.slurm_dir, stream)
            link = slurm.log_path(job_id, point_plan.slurm_dir, stream)
            with suppress(FileExistsError):
                link.symlink_to(os.path.relpath(target, link.parent))
    throttle = f", {plan.throttle} at a time" if plan.throttle else ""
    after = f", after {dependency}" if dependency else ""
    console.print(
        f"submitted array {base_id} ({len(group)} points on {first.system.nodes} node(s){throttle}{after}): "
        f"{plan.folder}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return base_id


def make_room(in_slurm: list[tuple[str, int]], width: int, window: int | None) -> list[str]:
    """The arrays (oldest first, taken out of in_slurm) that a new array running width tasks at once must
    wait for, so that no more than window points run together; none without a window."""
    waits = []
    while window and in_slurm and sum(n for _, n in in_slurm) + width > window:
        waits.append(in_slurm.pop(0)[0])
    return waits


def _merge_counts(tasks: list[tuple[str, int]], window: int | None) -> list[tuple[str, int]]:
    """(array id, tasks) summed per array in first-seen order, each at most the window (its %N)."""
    counts: dict[str, int] = {}
    for array, n in tasks:
        counts[array] = counts.get(array, 0) + n
    return [(array, min(n, window) if window else n) for array, n in counts.items()]


def _base_id(point: Point) -> str:
    """The job id a dependency names: an array's base id, so it waits for every task."""
    return point.job_ids[0].split("_")[0]


def _outcome(point: Point) -> str:
    """Short enough for the progress line; the whole error is in the summary."""
    if point.status == "ok":
        return f"ok, {point.result.get('samples_per_s', 0):,.2f} samples/s"
    return point.status


def view(folder: Path) -> SweepState:
    """The sweep as it stands now, written nowhere: sweep.json, each running point's state read again
    from its run directory (and Slurm)."""
    state = SweepState.load(folder)
    for point in state.points:
        if point.status == "running" and point.run_dir:
            _classify(point)
    return state


def _update(folder: Path) -> SweepState:
    """view(), saved: only under the runner's lock."""
    state = view(folder)
    state.save(folder)
    return state


def wait(folder: Path, poll_s: float = 10.0) -> SweepState:
    """Until no point is running and no process is running the sweep; then the sweep's files brought up
    to date (unless another runner has started meanwhile: it writes them)."""
    from flux_cluster.launch.rundir import lock_held

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
        "nodes": _run_nodes(run_dir),
        "wall_s": result.minutes * 60 if result.minutes else None,
    }
    return True


def _run_nodes(run_dir: Path) -> int | None:
    """The node count the run was launched with (its config.yaml), None if unreadable."""
    from flux_cluster.launch.rundir import CONFIG_FILE, read_run_config

    try:
        system, _ = read_run_config(run_dir / CONFIG_FILE)
    except (OSError, ValueError, KeyError, TypeError, FluxClusterError):
        return None
    return system.nodes


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
