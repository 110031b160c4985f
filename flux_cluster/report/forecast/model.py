"""The forecast's arithmetic: communication per step, the step-time fit, evaluation time, convergence.

Step time of data-parallel FSDP2/HSDP training at ``m`` samples per GPU on ``n`` GPUs::

    t(m, n) = a + b * m + comm(n)

- ``comm(n)``: the bytes one GPU moves per step in the collectives of the configured sharding, over the
  bandwidth of the links they cross, not overlapped with compute (FSDP2 prefetches, so this is the most
  it costs). A shard group of k GPUs (r = n / k replicas) all-gathers the parameters in the forward and
  again in the backward (param_dtype bytes each), reduce-scatters the gradients in float32, and the
  replicas all-reduce their float32 shard: per GPU ``(2 p + 2 p + 4) P (k - 1) / k + 2 * 4 P / k * (r - 1)
  / r`` bytes (ring collectives, the bandwidth-optimal count), P the model's parameters.
- The bandwidth of a collective: the scale-up fabric's within one domain (NVLink, Infinity Fabric);
  across domains, the scale-up one or the NICs of the group's members in one domain together, whichever
  is less (a ring leaves a domain through as many NICs as the group has members there); times
  ``EFFICIENCY``, the share of the datasheet figure NCCL's ring collectives reach (nccl-tests' bus
  bandwidth for large messages). A measured bus bandwidth (``--bandwidth``) replaces all of it.
- ``a`` (fixed: optimizer, launch) and ``b`` (per sample) are fitted to the inputs' step times less their
  own ``comm``: least squares over at least two per-GPU batch sizes; with one, ``a`` is 0 (what does not
  shrink with the batch is then the communication alone).

The band: the fit redone at the ends of ``EFFICIENCY_RANGE`` (what the fixed part may be: it matters
most when the per-GPU batch moves away from the measured one), the inputs' own spread and the fit's
residuals, combined in quadrature with the convergence band (``samples_band``).
"""

import math
import statistics
from dataclasses import dataclass
from functools import cache
from typing import Literal

from flux_cluster.errors import FluxClusterError

EFFICIENCY = 0.8
"""Share of the datasheet link bandwidth NCCL's ring all-gather and reduce-scatter reach for messages of
tens of MB and more (nccl-tests bus bandwidth: about 360 of NVLink 4's 450 GB/s on 8 H100)."""
EFFICIENCY_RANGE = (0.6, 1.0)
"""What the collectives may reach: the datasheet is the ceiling; 0.6 a congested or badly placed job."""
REDUCE_BYTES = 4
"""Gradients are reduced in float32 (training/parallelize.py reduce_dtype)."""
Z = 2.0
"""Half-widths are two standard deviations (about 95%) of what is random: convergence, timing noise."""

DpShard = int | Literal["world"] | None
"""The shard group: a GPU count, 'world' (plain FSDP over every GPU), None (one node's GPUs, HSDP)."""


@dataclass(frozen=True)
class Fabric:
    """The links of a system, per GPU and per direction (configs/systems/*.yaml interconnect)."""

    system: str
    gpus_per_node: int
    scale_up_gbps: float | None
    scale_up_domain: int
    scale_out_gbps: float | None
    measured_gbps: float | None = None
    """A measured bus bandwidth for every collective (--bandwidth); wins over the datasheet figures."""


@dataclass(frozen=True)
class Comm:
    seconds: float
    bytes: float
    """Per GPU per step."""
    text: str
    """How it was counted, for the row's basis."""


def shard_group(n: int, gpus_per_node: int, dp_shard: DpShard) -> int:
    """The GPUs that shard one copy of the model at n GPUs."""
    if dp_shard == "world":
        return n
    k = min(n, dp_shard or gpus_per_node)
    if n % k:
        raise FluxClusterError(f"dp_shard {k} does not divide {n} GPUs: give --dp-shard or another count")
    return k


def _bandwidth(fabric: Fabric, members: int, span: int, stride: int, efficiency: float) -> float:
    """GB/s of a ring over ``members`` GPUs ``stride`` apart across ``span`` consecutive GPUs."""
    if fabric.measured_gbps is not None:
        return fabric.measured_gbps * efficiency / EFFICIENCY
    domain = fabric.scale_up_domain
    one_domain = span <= domain
    per_domain = members if one_domain else max(1, min(members, domain // stride))
    up, out = fabric.scale_up_gbps, fabric.scale_out_gbps
    if one_domain:
        if up is None:
            raise FluxClusterError(
                f"system {fabric.system}: interconnect.scale_up_gbps: not set; needed for {members} GPUs "
                "in one node (set it, or give --bandwidth with a measured bus bandwidth)"
            )
        return up * efficiency
    if out is None:
        raise FluxClusterError(
            f"system {fabric.system}: interconnect.scale_out_gbps: not set; needed for {span} GPUs over "
            f"{math.ceil(span / domain)} scale-up domains (set it, or give --bandwidth)"
        )
    across = per_domain * out
    return (min(up, across) if up is not None else across) * efficiency


def comm_seconds(
    params: float, param_bytes: int, n: int, fabric: Fabric, dp_shard: DpShard, efficiency: float = EFFICIENCY
) -> Comm:
    """What the sharded model's collectives cost per step on n GPUs (module docstring)."""
    if n <= 1:
        return Comm(0.0, 0.0, "one GPU: no collectives")
    k = shard_group(n, fabric.gpus_per_node, dp_shard)
    r = n // k
    shard_bytes = (2 * param_bytes + REDUCE_BYTES) * params * (k - 1) / k
    replica_bytes = 2 * REDUCE_BYTES * params / k * (r - 1) / r
    seconds, parts = 0.0, []
    if k > 1:
        bandwidth = _bandwidth(fabric, k, k, 1, efficiency)
        seconds += shard_bytes / (bandwidth * 1e9)
        parts.append(f"shard groups of {k}: {shard_bytes / 1e9:.3g} GB at {bandwidth:.3g} GB/s")
    if r > 1:
        bandwidth = _bandwidth(fabric, r, n, k, efficiency)
        seconds += replica_bytes / (bandwidth * 1e9)
        parts.append(f"{r} replicas: {replica_bytes / 1e9:.3g} GB at {bandwidth:.3g} GB/s")
    return Comm(seconds, shard_bytes + replica_bytes, ", ".join(parts))


@dataclass(frozen=True)
class Sample:
    """One measured step: per-GPU batch, GPUs, seconds, the relative spread of its measurement."""

    per_gpu_batch: float
    gpus: int
    step_s: float
    spread: float
    """Relative standard deviation of the step time (between runs, or between a sweep's steps)."""


@dataclass(frozen=True)
class StepFit:
    fixed_s: float
    """a: what neither shrinks with the batch nor is communication."""
    per_sample_s: float
    """b: seconds per sample per GPU."""
    residual: float
    """The fit's root-mean-square relative residual."""
    batches: tuple[float, float]
    """The measured per-GPU batches, smallest and largest."""


def fit_steps(samples: list[Sample], comm: list[float]) -> StepFit:
    """a and b by least squares over the steps less their communication; a = 0 with one batch size."""
    xs = [s.per_gpu_batch for s in samples]
    ys = [s.step_s - c for s, c in zip(samples, comm, strict=True)]
    a, b = 0.0, sum(ys) / sum(xs)
    if len(set(xs)) >= 2:
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        sxx = sum((x - mean_x) ** 2 for x in xs)
        b = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
        a = mean_y - b * mean_x
        if a < 0:  # a negative fixed cost is noise: through the origin instead
            a, b = 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    if b <= 0:
        raise FluxClusterError(
            "the measured step times do not grow with the per-GPU batch once the modelled communication is "
            "taken off: the inputs disagree, or the bandwidth is too low (check interconnect or --bandwidth)"
        )
    pairs = zip(samples, comm, strict=True)
    residuals = [(a + b * s.per_gpu_batch + c - s.step_s) / s.step_s for s, c in pairs]
    rms = math.sqrt(statistics.fmean(r * r for r in residuals))
    return StepFit(a, b, rms, (min(xs), max(xs)))


def eval_fit(points: list[tuple[int, float]], eval_samples: int) -> tuple[float, float]:
    """(fixed seconds, seconds per validation sample per GPU) of one evaluation from (GPUs, seconds)
    pairs: each GPU scores eval_samples / GPUs; the fixed part needs two GPU counts (else 0)."""
    xs = [eval_samples / g for g, _ in points]
    ys = [s for _, s in points]
    if len(set(xs)) >= 2:
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
            (x - mean_x) ** 2 for x in xs
        )
        fixed = mean_y - slope * mean_x
        if fixed >= 0 and slope > 0:
            return fixed, slope
    return 0.0, sum(ys) / sum(xs)


@cache
def olympic_sd(runs: int = 10, draws: int = 20000) -> float:
    """Standard deviation of the olympic mean (the best and the worst dropped) of ``runs`` draws of a unit
    normal: how much a submission's mean samples to converge varies, in RCP standard deviations."""
    import numpy as np

    values = np.sort(np.random.default_rng(0).standard_normal((draws, runs)), axis=1)[:, 1:-1].mean(axis=1)
    return float(values.std())


def samples_band(
    mean: float, stdev: float, ratio: float, doublings: float = 0.0, runs: int = 10
) -> tuple[float, float, float]:
    """(low, point, high) samples to converge whose score counts: the RCP mean times the inputs' own
    convergence ratio (never below 1: the summarizer scales a faster submission up to the RCP mean, so
    the RCP mean is also the low end); high: Z standard deviations of a submission's olympic mean and of
    carrying the ratio to this batch, one reference run's spread per doubling of the batch away from the
    nearest measured one (at least one)."""
    point = mean * max(1.0, ratio)
    spread = math.hypot(olympic_sd(runs) * stdev, max(1.0, doublings) * stdev)
    return mean, point, point + Z * spread


def evaluations(samples: float, global_batch: int, interval_samples: int) -> int:
    """Evaluations up to convergence: every ceil(interval / batch) steps."""
    every = math.ceil(interval_samples / global_batch) * global_batch
    return math.ceil(samples / every)


def quadrature(*parts: float) -> float:
    return math.sqrt(sum(p * p for p in parts))
