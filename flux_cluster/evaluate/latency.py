"""Latency statistics of an image generator, kept apart from any model so they can be checked on a
stand-in with known sleeps."""

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Latency:
    """Seconds per image over the timed generations (the JSON contract's L)."""

    p50_s: float
    p90_s: float
    p99_s: float
    mean_s: float
    images_per_s: float
    peak_memory_gb: float | None
    """Peak accelerator memory while generating; None where it is not measured (CPU)."""
    samples: int

    def to_json(self) -> dict[str, float | int | None]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def measure_latency(
    generate: Callable[[int], object],
    *,
    runs: int,
    warmup: int,
    synchronize: Callable[[], None] = lambda: None,
    peak_memory_gb: Callable[[], float | None] = lambda: None,
    reset_peak_memory: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
    made: Callable[[], None] = lambda: None,
) -> Latency:
    """generate(i) makes one image; warmup calls are not timed, then runs calls are, with i = 0..runs-1.
    synchronize waits for queued device work (CUDA), so each time covers the whole image. made() is called
    after every image (warm-up ones too), outside the timed part: a progress bar."""
    if runs < 1 or warmup < 0:
        raise ValueError(f"runs {runs} (at least 1), warmup {warmup} (at least 0)")
    for i in range(warmup):
        generate(i)
        made()
    synchronize()
    reset_peak_memory()
    seconds = []
    for i in range(runs):
        start = clock()
        generate(i)
        synchronize()
        seconds.append(clock() - start)
        made()
    return Latency(
        p50_s=percentile(seconds, 50),
        p90_s=percentile(seconds, 90),
        p99_s=percentile(seconds, 99),
        mean_s=sum(seconds) / len(seconds),
        images_per_s=len(seconds) / max(sum(seconds), 1e-12),
        peak_memory_gb=peak_memory_gb(),
        samples=len(seconds),
    )


class ImageProgress:
    """Images made so far, images/s and the time left: a rich bar on a terminal, else (a job's log) a
    line every interval_s."""

    def __init__(
        self,
        label: str,
        total: int,
        log: Callable[[str], None],
        terminal: bool,
        interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.total, self.log, self.interval_s, self.clock = label, total, log, interval_s, clock
        self.done = 0
        self.started = self.last_line = clock()
        self.bar: Any = None
        if terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            from flux_cluster.console import cli_console

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("images  {task.fields[rate]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=cli_console(stderr=True),
                transient=True,
            )
            self.task = self.bar.add_task(label, total=total, rate="- images/s")

    def __enter__(self) -> "ImageProgress":
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def advance(self) -> None:
        self.done += 1
        elapsed = self.clock() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, rate=f"{rate:.2f} images/s")
        elif self.clock() - self.last_line >= self.interval_s and self.done < self.total:
            self.last_line = self.clock()
            left = (self.total - self.done) / rate if rate > 0 else math.inf
            eta = f"{left:,.0f} s left" if math.isfinite(left) else "time left unknown"
            self.log(f"{self.label}: {self.done}/{self.total} images, {rate:.2f} images/s, {eta}")
