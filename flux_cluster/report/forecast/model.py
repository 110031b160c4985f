"""The forecast's arithmetic: communication per step, the step-time fit, evaluation time, convergence.

Step time of data-parallel FSDP2/HSDP training at ``m`` samples per GPU on ``n`` GPUs::

    t(m, n) = a + max(b m, c(n)) + e * min(b m, c(n))

- ``c(n)``: the seconds one GPU's collectives take per step at the configured sharding, counted as if
  alone on the links. A shard group of k GPUs (r = n / k replicas) all-gathers the parameters in the
  forward and again in the backward of every micro-batch (param_dtype bytes each; ``g`` micro-batches a
  step: gradient accumulation re-gathers, the gradients are reduced once, training/loop.py), reduce-scatters
  the gradients in float32, and the replicas all-reduce their float32 shard: per GPU
  ``(2 p g + 4) P (k - 1) / k + 2 * 4 P / k * (r - 1) / r`` bytes (ring collectives, the bandwidth-optimal
  count), P the model's parameters.
- The overlap: FSDP2 prefetches the next block's all-gather and reduce-scatters on a side stream, so the
  shorter of compute (``b m``) and communication hides under the longer, all but a share ``e`` (``EXPOSED``):
  the first all-gather and the last reduce-scatter of a step, and what the collectives' kernels take from
  the compute they run beside (NCCL's channels hold 16 to 32 of a B200's 148 SMs). ``e`` is not measured
  by inputs that are all compute-bound; the band spans ``EXPOSED_RANGE``. On CPU (gloo) nothing overlaps:
  ``e`` is 1 there (``Setup`` picks it: ``OVERLAP_CPU``).
- The bandwidth of a collective: the scale-up fabric's within one domain (NVLink, Infinity Fabric);
  across domains, the scale-up one or the NICs of the group's members in one domain together, whichever
  is less (a ring leaves a domain through as many NICs as the group has members there); times
  ``EFFICIENCY``, the share of the datasheet figure NCCL's ring collectives reach (nccl-tests' bus
  bandwidth for large messages), the band at ``EFFICIENCY_RANGE``. ``--bandwidth`` sets the scale-up
  link's (``--inter-bandwidth`` the scale-out NICs') as a measured bus bandwidth: used as measured, the
  band then ``MEASURED_RANGE`` of it.
- ``a`` (fixed: optimizer, launch) and ``b`` (per sample) are fitted to the inputs' step times by least
  squares over at least two per-GPU batch sizes, each input in its regime (compute- or communication-
  bound). With one per-GPU batch ``a`` is not measured: it is taken as ``FIXED_SHARE`` of the measured
  step's compute at most (what a FLUX step measured on one GPU does not shrink by with the batch), the
  point at half of it, the band at both ends; the row says it extrapolates.

The band: every uncertain input of the model at both ends of its range (efficiency, exposed share, the
unmeasured fixed part), each taken as two standard deviations and combined in quadrature with the
inputs' timing noise carried to the forecast batch (the least-squares prediction error, which grows with
the distance from the measured batches) and with the convergence band (``samples_band``).
"""

import math
import statistics
from dataclasses import dataclass, replace
from functools import cache
from typing import Literal

from flux_cluster.errors import FluxClusterError

EFFICIENCY = 0.8
"""Share of the datasheet link bandwidth NCCL's ring all-gather and reduce-scatter reach for messages of
tens of MB and more (nccl-tests bus bandwidth: about 360 of NVLink 4's 450 GB/s on 8 H100)."""
EFFICIENCY_RANGE = (0.6, 1.0)
"""What the collectives may reach: the datasheet is the ceiling; 0.6 a congested or badly placed job."""
MEASURED_RANGE = (0.8, 1.0)
"""A measured bus bandwidth (--bandwidth, --inter-bandwidth) is taken as measured; the band: down to 0.8
of it (nccl-tests measure the large messages; a step's per-block collectives are smaller) and no more."""
EXPOSED = 0.15
"""The share of the shorter of compute and communication that does not hide under the longer (module
docstring): NCCL's 16-32 of 148 SMs (11-22%) while a collective runs, and the first and last collectives
of a step (about 2% with some 60 FSDP blocks)."""
EXPOSED_RANGE = (0.05, 0.3)
OVERLAP_CPU = 1.0
"""gloo on CPU: the collectives run on the compute threads, nothing overlaps."""
FIXED_SHARE = 0.27
"""With one measured per-GPU batch: the fixed part is at most this share of the measured step's compute.
Measured (docs/benchmarks.md, one H100, 2026-11-27): our bf16 step of the flux-schnell-wide proxy at
micro-batch 32 and 64 (97.36 and 109.07 samples/s) is 70.6 ms + 8.07 ms per sample, so 27% of the compute
at 32 does not shrink with the batch (fp8 on an H200: 37%). That includes an optimizer pass over the whole
unsharded proxy (about 21-25 ms by its memory traffic: 2.5 B parameters, some 28 bytes each, at 3.35 TB/s)
which a sharded run spreads over its GPUs, so it bounds the fixed part from above (without it: 18-19%).
The point is at half of it, as for every unmeasured range here; one measured pair, so the band, not the
point, is what to read."""
REDUCE_BYTES = 4
"""Gradients are reduced in float32 (training/parallelize.py reduce_dtype)."""
Z = 2.0
"""Half-widths are two standard deviations (about 95%): the ends of every range above are taken as two
standard deviations of what is not known, and the noise as measured."""

DpShard = int | Literal["world"] | None
"""The shard group: a GPU count, 'world' (plain FSDP over every GPU), None (one node's GPUs, HSDP)."""


End = int
"""Which end of a range a value is taken at: 0 the point, -1 the low end, 1 the high end."""


@dataclass(frozen=True)
class Fabric:
    """The links of a system, per GPU and per direction (configs/systems/*.yaml interconnect)."""

    system: str
    gpus_per_node: int
    scale_up_gbps: float | None
    scale_up_domain: int
    scale_out_gbps: float | None
    measured_gbps: float | None = None
    """A measured bus bandwidth within one scale-up domain (--bandwidth): replaces scale_up_gbps x
    EFFICIENCY."""
    measured_out_gbps: float | None = None
    """A measured bus bandwidth of a collective across domains (--inter-bandwidth): replaces what the NICs
    give (the scale-up link still caps it)."""

    def scale(self, measured: float | None, end: End) -> float:
        """The factor on a link's bandwidth at an end of its range: measured, or the datasheet's share."""
        if measured is not None:
            return measured * (1.0, MEASURED_RANGE[1], MEASURED_RANGE[0])[end]
        return (EFFICIENCY, EFFICIENCY_RANGE[1], EFFICIENCY_RANGE[0])[end]


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


def _up(fabric: Fabric, end: End) -> float | None:
    """The scale-up link's GB/s at an end (None: not set and not measured)."""
    if fabric.measured_gbps is not None:
        return fabric.scale(fabric.measured_gbps, end)
    return fabric.scale_up_gbps * fabric.scale(None, end) if fabric.scale_up_gbps is not None else None


def _bandwidth(fabric: Fabric, members: int, span: int, stride: int, end: End) -> float:
    """GB/s of a ring over ``members`` GPUs ``stride`` apart across ``span`` consecutive GPUs. End: which end
    of the efficiency (or measured) range (0, the point; -1 the slow end; 1 the fast end)."""
    domain = fabric.scale_up_domain
    up = _up(fabric, end)
    if span <= domain:
        if up is None:
            raise FluxClusterError(
                f"system {fabric.system}: interconnect.scale_up_gbps: not set; needed for {members} GPUs "
                "in one node (set it, or give --bandwidth with a measured bus bandwidth)"
            )
        return up
    if fabric.measured_out_gbps is not None:
        across = fabric.scale(fabric.measured_out_gbps, end)
    elif fabric.scale_out_gbps is not None:
        per_domain = max(1, min(members, domain // stride))
        across = per_domain * fabric.scale_out_gbps * fabric.scale(None, end)
    else:
        raise FluxClusterError(
            f"system {fabric.system}: interconnect.scale_out_gbps: not set; needed for {span} GPUs over "
            f"{math.ceil(span / domain)} scale-up domains (set it, or give --inter-bandwidth)"
        )
    return min(up, across) if up is not None else across


def comm_seconds(
    params: float,
    param_bytes: int,
    n: int,
    fabric: Fabric,
    dp_shard: DpShard,
    end: End = 0,
    gathers: int = 1,
) -> Comm:
    """What the sharded model's collectives cost per step on n GPUs, alone on the links (module docstring);
    ``gathers``: micro-batches per step (each all-gathers the parameters for its forward and backward)."""
    if n <= 1:
        return Comm(0.0, 0.0, "one GPU: no collectives")
    k = shard_group(n, fabric.gpus_per_node, dp_shard)
    r = n // k
    shard_bytes = (2 * param_bytes * gathers + REDUCE_BYTES) * params * (k - 1) / k
    replica_bytes = 2 * REDUCE_BYTES * params / k * (r - 1) / r
    seconds, parts = 0.0, []
    if k > 1:
        bandwidth = _bandwidth(fabric, k, k, 1, end)
        seconds += shard_bytes / (bandwidth * 1e9)
        again = f", parameters gathered for {gathers} micro-batches" if gathers > 1 else ""
        parts.append(f"shard groups of {k}: {shard_bytes / 1e9:.3g} GB at {bandwidth:.3g} GB/s{again}")
    if r > 1:
        bandwidth = _bandwidth(fabric, r, n, k, end)
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
    gathers: int = 1
    """Micro-batches per step (gradient accumulation): each re-gathers the parameters."""


@dataclass(frozen=True)
class StepFit:
    fixed_s: float
    """a: what neither grows with the batch nor is communication."""
    per_sample_s: float
    """b: seconds of compute per sample per GPU."""
    exposed: float
    """e: the share of the shorter of compute and communication not hidden under the longer."""
    residual: float
    """The fit's root-mean-square relative residual."""
    batches: tuple[float, ...]
    """The measured per-GPU batches, ascending."""

    def step(self, per_gpu: float, comm: float) -> float:
        compute = self.per_sample_s * per_gpu
        return self.fixed_s + max(compute, comm) + self.exposed * min(compute, comm)

    @property
    def measured_fixed(self) -> bool:
        """Whether the inputs measured the fixed part (two per-GPU batches or more)."""
        return len(self.batches) >= 2

    def prediction_error(self, per_gpu: float, noise: float) -> float:
        """Relative standard error of the step at ``per_gpu`` from the inputs' noise and residual: the
        least-squares prediction error, growing with the distance from the measured batches."""
        sigma = math.hypot(noise, self.residual)
        if not self.measured_fixed:
            return sigma
        mean = statistics.fmean(self.batches)
        sxx = sum((x - mean) ** 2 for x in self.batches)
        return sigma * math.sqrt(1 / len(self.batches) + (per_gpu - mean) ** 2 / sxx)


def _least_squares(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(a, b) of y = a + b x; a negative a is noise: through the origin instead."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx > 0:
        b = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
        a = mean_y - b * mean_x
        if a >= 0:
            return a, b
    return 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)


def fit_steps(
    samples: list[Sample], comm: list[float], exposed: float = EXPOSED, fixed_share: float = FIXED_SHARE / 2
) -> StepFit:
    """a and b by least squares, each input in its regime (compute- or communication-bound, iterated until
    none changes); with one per-GPU batch, a = fixed_share of the measured compute (module docstring)."""
    ms = [s.per_gpu_batch for s in samples]
    ys = [s.step_s for s in samples]
    compute_bound = [True] * len(samples)
    a = b = 0.0
    for _ in range(len(samples) + 1):
        xs = [m if bound else exposed * m for m, bound in zip(ms, compute_bound, strict=True)]
        ts = [y - (exposed * c if bound else c) for y, c, bound in zip(ys, comm, compute_bound, strict=True)]
        if len(set(ms)) >= 2:
            a, b = _least_squares(xs, ts)
        else:  # one batch: t = a + b x with a = fixed_share x b m (a share of the measured compute)
            scale = fixed_share * sum(ms) + sum(xs)
            b = sum(ts) / scale if scale > 0 else 0.0
            a = fixed_share * b * statistics.fmean(ms)
        regimes = [b * m >= c for m, c in zip(ms, comm, strict=True)]
        if regimes == compute_bound:
            break
        compute_bound = regimes
    if b <= 0 or not math.isfinite(b):
        raise FluxClusterError(
            "the measured step times do not grow with the per-GPU batch once the modelled communication is "
            "taken off: the inputs disagree, or the bandwidth is too low (check interconnect or --bandwidth)"
        )
    fit = StepFit(a, b, exposed, 0.0, tuple(sorted(set(ms))))
    residuals = [
        (fit.step(s.per_gpu_batch, c) - s.step_s) / s.step_s for s, c in zip(samples, comm, strict=True)
    ]
    return replace(fit, residual=math.sqrt(statistics.fmean(r * r for r in residuals)))


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
    mean: float, stdev: float, ratio: float, doublings: float = 0.0, runs: int = 10, systematic: float = 0.0
) -> tuple[float, float, float]:
    """(low, point, high) samples to converge whose score counts: the RCP mean times the inputs' own
    convergence ratio (never below 1: the summarizer scales a faster submission up to the RCP mean, so
    the RCP mean is also the low end); high: Z standard deviations of three things, in quadrature:
    - a submission's olympic mean (``olympic_sd`` of one reference run's ``stdev``);
    - carrying the ratio to this batch: it may drift by one reference run's standard deviation per doubling
      of the batch away from the nearest measured one (an assumption: no submission publishes its
      convergence at batches it did not run);
    - another implementation or other hyperparameters at the same batch: ``systematic``, the relative
      spread between the rulesets' reference sets (rcp.reference_spread), at least one reference run's
      standard deviation."""
    point = mean * max(1.0, ratio)
    same_batch = max(stdev, systematic * mean)
    spread = quadrature(olympic_sd(runs) * stdev, doublings * stdev, same_batch)
    return mean, point, point + Z * spread


def evaluations(samples: float, global_batch: int, interval_samples: int) -> int:
    """Evaluations up to convergence: every ceil(interval / batch) steps."""
    every = math.ceil(interval_samples / global_batch) * global_batch
    return math.ceil(samples / every)


def quadrature(*parts: float) -> float:
    return math.sqrt(sum(p * p for p in parts))
