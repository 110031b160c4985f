"""What benchmarks/data_prep.py prints (rich tables and notes) and writes (the figures, as JSON)."""

import argparse
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from data_pipeline.measure import Rounds, Step

COLUMNS = (
    "step",
    "s",
    "CPU (sys) s",
    "samples/s",
    "MB/s",
    "vs copy",
    "peak RSS MB",
    "peak anon MB",
    "runs MB/s",
)


def steps_table(steps: list[Step], rounds: Rounds) -> Table:
    baseline = rounds.baseline
    table = Table(box=box.SIMPLE, title="data preparation, real dims")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "step" else "right")
    for step in steps:
        table.add_row(
            step.name + (" (baseline)" if step is baseline else ""),
            f"{step.seconds:.1f}",
            "-" if step.cpu_seconds is None else f"{step.cpu_seconds:.1f} ({step.sys_seconds:.1f})",
            f"{step.samples_per_s:,.1f}",
            f"{step.mb_per_s:,.0f}",
            f"{step.mb_per_s / baseline.mb_per_s:.2f}x",
            "-" if step.peak_rss_mb is None else f"{step.peak_rss_mb:,.0f}",
            "-" if step.peak_anon_mb is None else f"{step.peak_anon_mb:,.0f}",
            " ".join(f"{r.mb_per_s:.0f}" for r in rounds.runs.get(step.name, [])),
        )
    return table


def profile_table(profile: list[dict[str, Any]], profiled: float, shard_size: int) -> Table:
    top = Table(
        box=box.SIMPLE,
        title="cProfile, one shard converted in-process, by own time",
        caption=f"{profiled:.2f} s profiled in all (shard 0, {shard_size} samples)",
    )
    for column in ("function", "calls", "own s", "cum s", "share"):
        top.add_column(column, justify="left" if column == "function" else "right")
    for entry in profile:
        top.add_row(
            entry["function"],
            f"{entry['calls']:,}",
            f"{entry['tottime_s']:.2f}",
            f"{entry['cumtime_s']:.2f}",
            f"{entry['share']:.0%}",
        )
    return top


def print_report(
    console: Console,
    args: argparse.Namespace,
    rounds: Rounds,
    steps: list[Step],
    loader: tuple[list[Step], list[float]],
    need: float,
    profile: tuple[list[dict[str, Any]], float],
) -> None:
    """The steps table, the notes under it, and the profile of one shard (if any)."""
    loader_steps, loader_setups = loader
    console.print(steps_table(steps, rounds))
    console.print(
        f"best of {args.repeats} interleaved rounds for copies and conversions (peak memory: the worst run); "
        "the streamed copy is the baseline (sendfile, no user-space copy, for scale). The source stays "
        "page-cached throughout; every written file is fsync'd. Peak RSS: largest process, counting the "
        "mapped source pages it touched; peak anon: heap summed over the process tree. CPU: user + sys."
    )
    console.print(
        f"convert outputs identical across runs and worker counts: {'yes' if rounds.identical else 'NO'}"
    )
    console.print(
        f"loader set-up and {args.warmup} warm-up batches: "
        + ", ".join(f"{s:.1f} s" for s in loader_setups)
        + f"; timed {args.batches} batches of {args.batch_size} each, one rank's loader"
    )
    console.print(
        f"one GPU training full-depth flux-schnell at 50% MFU of 989 TFLOP/s (H100) consumes {need:.1f} "
        "samples/s; this rank's loader gives "
        + ", ".join(
            f"{s.samples_per_s:.0f} with {s.name.split(', ')[1]} ({s.samples_per_s / need:.1f}x)"
            for s in loader_steps
        )
    )
    if profile[0]:
        console.print(profile_table(*profile, args.shard_size))


def figures(
    args: argparse.Namespace,
    source: dict[str, Any],
    rounds: Rounds,
    steps: list[Step],
    loader_setups: list[float],
    need: float,
    profile: tuple[list[dict[str, Any]], float],
) -> dict[str, Any]:
    """Everything measured, for --json. ``source``: samples, source_bytes, arrow_files, synth_seconds."""
    baseline = rounds.baseline
    return {
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        **source,
        "runs": {
            name: [asdict(r) | {"mb_per_s": r.mb_per_s} for r in measured]
            for name, measured in rounds.runs.items()
        },
        "baseline": baseline.name,
        "steps": [
            asdict(s)
            | {
                "samples_per_s": s.samples_per_s,
                "mb_per_s": s.mb_per_s,
                "vs_copy": s.mb_per_s / baseline.mb_per_s,
            }
            for s in steps
        ],
        "outputs_identical": rounds.identical,
        "loader_setup_seconds": loader_setups,
        "gpu_need_samples_per_s": need,
        "profile_one_shard": profile[0],
        "profile_total_seconds": profile[1],
    }
