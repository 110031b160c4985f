"""A sweep's folder, ``runs/<sweep>/``: ``sweep.json`` (the grid, the points and their states) and
``runs_summary.csv`` (one row per point), beside the points' run directories. No torch here: the report
and ``flux-cluster --help`` read it."""

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flux_cluster.atomic import write_atomic
from flux_cluster.errors import FluxClusterError
from flux_cluster.safe_text import csv_text

SWEEP_FILE = "sweep.json"
SUMMARY_FILE = "runs_summary.csv"

FINISHED = ("ok", "oom", "not converged")
"""A point in one of these states has its answer; --resume runs the others again."""

FIGURES = (
    "samples_per_s",
    "samples_per_s_per_gpu",
    "step_time_ms_p50",
    "step_time_ms_p90",
    "step_time_ms_p99",
    "tflops_per_gpu",
    "mfu",
    "mfu_measured",
    "peak_memory_gb",
    "data_wait_ms",
)
"""The throughput figures of a point, as runs_summary.csv names its columns."""


@dataclass
class Point:
    """One combination of the grid's values, and what became of it."""

    index: int
    values: dict[str, str]
    """Grid key -> value, as the grid gave it (a --set value)."""
    status: str = "pending"
    """pending, running, ok, oom, failed or 'not converged' (a train job that did not reach its target)."""
    run_dir: str | None = None
    job_ids: list[str] = field(default_factory=list)
    launcher: str | None = None
    result: dict[str, Any] = field(default_factory=dict)
    """The throughput record (or a train job's figures); empty until the point ends."""
    error: str | None = None
    """Why a failed or oom point ended, in one line."""
    derived: list[str] = field(default_factory=list)
    """--set values the sweep chose for this point, after the grid's: a throughput sweep's one-step
    global batch (train.global_batch_size = micro_batch_size x ranks) when no global batch is given. Not
    the user's choice (launch/sweep_plan.point_overrides)."""

    @property
    def label(self) -> str:
        return ", ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in self.values.items())


@dataclass
class SweepState:
    name: str
    system: str
    job: str
    """throughput or train."""
    grid: dict[str, list[str]]
    overrides: list[str]
    """--set values every point shares (the grid's come after them)."""
    synthetic: bool
    max_parallel: int | None
    here: bool
    """Run on this machine even on a Slurm system."""
    created_at: float
    points: list[Point]
    price_per_gpu_hour: float | None = None
    warmup_steps: int | None = None
    steps: int | None = None

    def save(self, folder: Path) -> None:
        write_atomic(folder / SWEEP_FILE, json.dumps(asdict(self), indent=2, default=_json_safe) + "\n")
        write_atomic(folder / SUMMARY_FILE, summary_csv(self))

    @classmethod
    def load(cls, folder: Path) -> "SweepState":
        path = folder / SWEEP_FILE
        try:
            data = json.loads(path.read_text())
            points = [Point(**p) for p in data.pop("points")]
            state = cls(**data, points=points)
        except OSError as exc:
            raise FluxClusterError(f"{path}: cannot read it ({exc.strerror}): not a sweep folder") from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise FluxClusterError(f"{path}: not a flux-cluster sweep file ({type(exc).__name__})") from None
        problem = _problem(state)
        if problem:
            raise FluxClusterError(f"{path}: {problem}: not a flux-cluster sweep file (or a damaged one)")
        return state

    @property
    def keys(self) -> list[str]:
        return list(self.grid)


def _strings(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _problem(state: SweepState) -> str | None:
    """What is wrong with a loaded sweep file's types, or None."""
    if not isinstance(state.grid, dict) or not all(isinstance(v, list) for v in state.grid.values()):
        return "grid: expected a mapping of key to a list of values"
    if state.max_parallel is not None and (not isinstance(state.max_parallel, int) or state.max_parallel < 1):
        return f"max_parallel {state.max_parallel!r}: expected null or a whole number >= 1"
    for point in state.points:
        if (
            not _strings(point.values)
            or not isinstance(point.result, dict)
            or not isinstance(point.job_ids, list)
            or not isinstance(point.derived, list)
            or not all(isinstance(item, str) for item in point.derived)
        ):
            return (
                f"point {point.index!r}: expected values (strings), result (a mapping), job_ids (a list), "
                "derived (a list of strings)"
            )
        if point.run_dir is not None and not isinstance(point.run_dir, str):
            return f"point {point.index!r}: run_dir {point.run_dir!r}: expected a path"
    return None


def _json_safe(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON")


def is_sweep_folder(path: Path) -> bool:
    return (path / SWEEP_FILE).is_file()


def summary_rows(state: SweepState) -> list[dict[str, Any]]:
    """One row per point: every varied value, the status, the figures, GPU-hours and cost."""
    rows = []
    for point in state.points:
        result = point.result
        row: dict[str, Any] = {"point": point.index, **point.values, "status": point.status}
        for name in FIGURES:
            row[name] = _number(result.get(name))
        gpus = result.get("world_size")
        gpus = gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 else None
        row["gpus"] = gpus
        wall_s = _number(result.get("wall_s"))
        gpu_hours = wall_s * gpus / 3600 if wall_s is not None and gpus else None
        row["gpu_hours"] = gpu_hours
        price = state.price_per_gpu_hour
        row["cost_usd"] = gpu_hours * price if gpu_hours is not None and price else None
        per_s = row["samples_per_s"]
        row["usd_per_million_samples"] = (
            price * gpus / 3600 / per_s * 1e6 if price and gpus and per_s else None
        )
        row["run_dir"] = point.run_dir
        row["error"] = point.error
        rows.append(row)
    return rows


def summary_columns(state: SweepState) -> list[str]:
    return [
        "point",
        *state.keys,
        "status",
        *FIGURES,
        "gpus",
        "gpu_hours",
        "cost_usd",
        "usd_per_million_samples",
        "run_dir",
        "error",
    ]


SUMMARY_FLOAT = "{:.6g}"
"""runs_summary.csv's figures: six significant digits."""


def summary_csv(state: SweepState) -> str:
    return csv_text(summary_rows(state), summary_columns(state), float_format=SUMMARY_FLOAT)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
