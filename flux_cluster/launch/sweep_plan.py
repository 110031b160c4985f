"""A sweep's request and plan: the grid parsed and counted, every point's config resolved and checked
before anything is written (a bad value is one line naming the point), and what a point launches."""

import math
import re
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING

from flux_cluster.config.hf import HF_BENCHMARK
from flux_cluster.errors import FluxClusterError
from flux_cluster.sweepdir import Point, SweepState

if TYPE_CHECKING:
    from rich.console import Console

    from flux_cluster.config import ResolvedSystem, SystemConfig
    from flux_cluster.config.loader import Override
    from flux_cluster.config.workload import TrainingPlan
    from flux_cluster.launch.submit import LaunchRequest


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
    from flux_cluster.config.workload import load_workload

    train = config.train
    if train.micro_batch_size == "auto":
        raise FluxClusterError(
            "train.micro_batch_size: 'auto' divides the global batch: --set train.global_batch_size=N "
            "(a throughput sweep otherwise sizes it from the micro-batch)"
        )
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
    fits: list[str] = field(default_factory=list)
    """The batch fits of fine-tuning points whose train split holds less than the default batch (each
    line once, as submit prints it)."""


def plan_sweep(request: SweepRequest) -> SweepPlan:
    """Every point's config resolved and checked (a bad value is one line naming the point); nothing
    written."""
    from flux_cluster.config import load_system
    from flux_cluster.config.workload import resolve_training

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
    if request.job != "train" and base.train.benchmark == HF_BENCHMARK:  # before any point is made
        raise FluxClusterError(f"--job {request.job}: a sweep of train.benchmark hf runs --job train")
    if request.submit:
        from flux_cluster.launch.submit import require_slurm

        require_slurm(base)
    slurm_points = base.launcher == "slurm" and not request.here
    if request.dependency is not None:
        check_sweep_dependency(request.dependency, slurm_points, request.max_parallel)
    scale = scales_batch(request)
    ranks, global_batch, fits = [], [], []
    for point in points:
        try:
            # a scaled point's batch comes from its micro-batch: the system's own global batch (say 32
            # under a micro-batch of 64) is no reason to refuse it
            unset = ["train.global_batch_size=null"] if scale else []
            resolved = load_system(
                request.system, point_overrides([*request.overrides, *unset], point, request.here)
            )
            if scale:
                point.derived = one_step_batch(resolved.config)
                resolved = load_system(
                    request.system, point_overrides(request.overrides, point, request.here)
                )
            config = resolved.config
            if config.train.micro_batch_size == "auto":  # as submit resolves it for the point's run
                from flux_cluster.training.batch_choice import resolve_micro_batch  # torch loads here

                config = resolve_micro_batch(config)[0]
            training = resolve_training(config)  # both jobs train
            if request.job == "train" and training.kind == "finetune":  # its batch as submit fits it
                training = _fitted(config, training, resolved)
                if training.batch_fit is not None and training.batch_fit.describe() not in fits:
                    fits.append(training.batch_fit.describe())
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
    return SweepPlan(request, base, points, slurm_points, ranks, global_batch, fits)


def _fitted(config: "SystemConfig", training: "TrainingPlan", resolved: "ResolvedSystem") -> "TrainingPlan":
    """A fine-tuning point's plan with the batch submit will give it (launch/submit.fit_train_batch), its
    data root as submit reads it (nothing made)."""
    from flux_cluster.console import cli_console
    from flux_cluster.launch.submit import fit_train_batch, with_training_data

    config = with_training_data(config, make=False, console=cli_console(stderr=True))
    return fit_train_batch(config, training, resolved)[1]


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
    for line in plan.fits:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    table = Table(box=None)
    for column in ("point", *request.grid, "ranks", "global batch"):
        table.add_column(escape(column))
    for point, ranks, gbs in zip(plan.points, plan.ranks, plan.global_batch, strict=True):
        table.add_row(str(point.index), *(escape(v) for v in point.values.values()), str(ranks), str(gbs))
    print_table(console, table)


def check_sweep_dependency(dependency: str, slurm_points: bool, window: int | None) -> None:
    from flux_cluster.launch.plan import check_dependency

    if not slurm_points:
        raise FluxClusterError(f"--dependency {dependency}: the points run on this machine, not in Slurm")
    check_dependency(dependency)
    if window and "?" in dependency:  # Slurm takes ',' or '?' in one list, never both
        raise FluxClusterError(
            f"--dependency {dependency}: with --max-parallel an array also waits (',') for the arrays before "
            "it, which Slurm cannot join to a '?' (any of) list; join yours with ',' or drop --max-parallel"
        )


DERIVED_ORIGIN = "the sweep (one step's batch)"
"""Where a throughput sweep's derived values come from (not the user's choice: Override.chosen False)."""


def point_overrides(shared: list[str], point: Point, here: bool) -> "list[str | Override]":
    """The --set values a point runs with: the sweep's, the point's (its grid values, then what the sweep
    derived for it), and launcher=local for --here."""
    from flux_cluster.config.loader import Override

    derived = [Override(item, DERIVED_ORIGIN, chosen=False) for item in point.derived]
    grid = [f"{key}={value}" for key, value in point.values.items()]
    return [*shared, *grid, *derived, *(["launcher=local"] if here else [])]


def point_request(folder: Path, state: SweepState, point: Point) -> "LaunchRequest":
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
