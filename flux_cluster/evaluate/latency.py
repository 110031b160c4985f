"""Latency statistics of an image generator, kept apart from any model so they can be checked on a
stand-in with known sleeps."""

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass


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
) -> Latency:
    """generate(i) makes one image; warmup calls are not timed, then runs calls are, with i = 0..runs-1.
    synchronize waits for queued device work (CUDA), so each time covers the whole image."""
    if runs < 1 or warmup < 0:
        raise ValueError(f"runs {runs} (at least 1), warmup {warmup} (at least 0)")
    for i in range(warmup):
        generate(i)
    synchronize()
    reset_peak_memory()
    seconds = []
    for i in range(runs):
        start = clock()
        generate(i)
        synchronize()
        seconds.append(clock() - start)
    return Latency(
        p50_s=percentile(seconds, 50),
        p90_s=percentile(seconds, 90),
        p99_s=percentile(seconds, 99),
        mean_s=sum(seconds) / len(seconds),
        images_per_s=len(seconds) / max(sum(seconds), 1e-12),
        peak_memory_gb=peak_memory_gb(),
        samples=len(seconds),
    )
