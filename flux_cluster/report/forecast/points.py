"""Forecast rows: minutes, GPU-hours and cost at a GPU count and global batch, with their band and basis,
from the fitted step model (model.py), the RCP of the batch (rcp.py) and the evaluation time; and the
same at each target's own GPU count and batch, beside its official score."""

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from flux_cluster.config.schema import SystemConfig
from flux_cluster.config.workload import MlperfFacts, load_workload
from flux_cluster.errors import FluxClusterError
from flux_cluster.report.forecast.inputs import Measured
from flux_cluster.report.forecast.model import (
    EFFICIENCY,
    EFFICIENCY_RANGE,
    EXPOSED,
    EXPOSED_RANGE,
    FIXED_SHARE,
    MEASURED_RANGE,
    OVERLAP_CPU,
    DpShard,
    End,
    Fabric,
    StepFit,
    Z,
    comm_seconds,
    eval_fit,
    evaluations,
    fit_steps,
    quadrature,
    samples_band,
)
from flux_cluster.report.rcp import reference, reference_spread

PARAM_BYTES = {"bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class Setup:
    """What the forecast takes from --system and the options."""

    system: SystemConfig
    fabric: Fabric
    dp_shard: DpShard
    model: str
    params: int
    param_bytes: int
    ruleset: str
    ruleset_from: str
    mlperf: MlperfFacts
    presets: tuple[int, ...]
    price: float | None
    """USD per GPU-hour: --price, else the system's price_per_gpu_hour (0: unknown)."""

    def per_gpu_batch(self, gpus: int) -> float:
        """The per-GPU batch a run at ``gpus`` takes: the system's configured global batch over the GPUs it
        is configured for; unset, a run at any node count takes the workload's reference batch."""
        if self.system.train.global_batch_size:
            return self.system.train.global_batch_size / (self.system.nodes * self.system.gpus_per_node)
        return self.mlperf.global_batch_size / gpus


def make_setup(
    system: SystemConfig,
    *,
    dp_shard: DpShard,
    bandwidth: tuple[float | None, float | None],
    ruleset: str,
    ruleset_from: str,
    price: float | None,
) -> Setup:
    workload, path = load_workload(system.train.benchmark)
    if workload.mlperf is None:
        raise FluxClusterError(
            f"system {system.name}: train.benchmark {system.train.benchmark!r} is a fine-tuning workload: a "
            "forecast is of the MLPerf flux1 time-to-train (a quality target and its RCPs)"
        )
    models = workload.models
    if system.train.model not in models:
        raise FluxClusterError(f"train.model: {system.train.model!r} is not a model of {path.name}")
    link = system.interconnect
    fabric = Fabric(
        system=system.name,
        gpus_per_node=system.gpus_per_node,
        scale_up_gbps=link.scale_up_gbps,
        scale_up_domain=link.scale_up_domain or system.gpus_per_node,
        scale_out_gbps=link.scale_out_gbps,
        measured_gbps=bandwidth[0],
        measured_out_gbps=bandwidth[1],
    )
    return Setup(
        system=system,
        fabric=fabric,
        dp_shard=dp_shard if dp_shard is not None else system.train.dp_shard,
        model=system.train.model,
        params=models[system.train.model].shape().parameters,
        param_bytes=PARAM_BYTES[system.train.param_dtype],
        ruleset=ruleset,
        ruleset_from=ruleset_from,
        mlperf=workload.mlperf,
        presets=tuple(sorted(workload.batch_presets)),
        price=price if price is not None else (system.price_per_gpu_hour or None),  # a system's 0: unset
    )


@dataclass
class Row:
    """One forecast point. Field names are the JSON and CSV schema: keep stable."""

    gpus: int
    nodes: int
    global_batch_size: int
    per_gpu_batch: float
    samples_per_s: float
    samples_per_s_low: float
    samples_per_s_high: float
    samples_to_converge: float
    samples_to_converge_low: float
    samples_to_converge_high: float
    minutes: float
    minutes_low: float
    minutes_high: float
    gpu_hours: float
    usd: float | None
    basis: str
    extrapolated: bool
    """The per-GPU batch lies outside the measured ones (the band says how much that costs)."""
    batch_from: str = "given"
    """'given' (N:B or --global-batch-size), 'preset' (the default for the scale) or 'target'."""
    target: str | None = None
    """--target: the results folder forecast."""
    actual_minutes: float | None = None
    """--target: its official score (olympic minutes times the RCP factor, as the summarizer)."""
    error: float | None = None
    """minutes / actual_minutes - 1."""
    inside: bool | None = None
    """actual_minutes within [minutes_low, minutes_high]."""
    actual_samples_per_s: float | None = None
    """--target: its measured training throughput (block_start..block_stop, the mean over its runs)."""
    actual_samples_to_converge: float | None = None
    """--target: its samples to converge (the olympic mean of its runs'), unscaled."""
    rate_error: float | None = None
    """samples_per_s / actual_samples_per_s - 1: the step model's share of the error (positive: fast)."""
    samples_error: float | None = None
    """samples_to_converge over the samples the score counts (actual_samples_to_converge, or the RCP mean
    where the summarizer scales a faster target up to it) - 1: the convergence's share (negative: too
    few). The two shares do not multiply to ``error`` exactly: evaluation and what lies outside the
    training blocks are in neither."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Forecast:
    """The rows, what they rest on, and the --deadline answer."""

    rows: list[Row]
    inputs: list[dict[str, Any]]
    model: dict[str, Any]
    ruleset: str
    ruleset_from: str
    system: str
    deadline: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "system": self.system,
            "ruleset": self.ruleset,
            "ruleset_from": self.ruleset_from,
            "model": self.model,
            "inputs": self.inputs,
            "rows": [r.to_json() for r in self.rows],
            "deadline": self.deadline,
            "warnings": self.warnings,
        }


class StepModel:
    """The step-time fit over the inputs at the model's point and at both ends of each uncertain input
    (model.py: bandwidth, exposed share, the fixed part where one per-GPU batch leaves it unmeasured)."""

    def __init__(self, setup: Setup, measured: list[Measured]) -> None:
        self.setup = setup
        self.measured = measured
        gpu = setup.system.dist_backend != "gloo"
        self.exposed = EXPOSED if gpu else OVERLAP_CPU
        batches = {m.sample.per_gpu_batch for m in measured}
        share = FIXED_SHARE / 2 if len(batches) < 2 else 0.0
        self.fit = self._fit(0, self.exposed, share)
        sources: dict[str, list[tuple[End, float, float]]] = {
            "bandwidth": [(-1, self.exposed, share), (1, self.exposed, share)]
        }
        if gpu:
            sources["overlap"] = [(0, e, share) for e in EXPOSED_RANGE]
        if len(batches) < 2:
            sources["fixed part"] = [(0, self.exposed, 0.0), (0, self.exposed, FIXED_SHARE)]
        self.dropped: list[str] = []
        self.variants: dict[str, list[tuple[End, StepFit]]] = {}
        for name, ends in sources.items():
            fits = []
            for end, exposed, fixed in ends:
                try:
                    fits.append((end, self._fit(end, exposed, fixed)))
                except FluxClusterError:  # that end contradicts the measured steps: it cannot be
                    self.dropped.append(f"{name} at its {'slow' if end < 0 else 'other'} end")
            self.variants[name] = fits
        spreads = [m.sample.spread for m in measured]
        self.noise = math.sqrt(statistics.fmean(s * s for s in spreads))
        ratios = [m.convergence_ratio for m in measured if m.convergence_ratio is not None]
        self.convergence_ratio = statistics.fmean(ratios) if ratios else 1.0
        self.ratio_batches = [m.global_batch for m in measured if m.convergence_ratio is not None]
        timed = [(m.sample.gpus, m.eval_s) for m in measured if m.eval_s]
        if timed:
            self.eval_fixed, self.eval_per_sample = eval_fit(timed, setup.mlperf.eval_samples)
            self.eval_from = "measured eval_start..eval_stop" + (
                "" if self.eval_fixed else " at one GPU count: taken as all per-sample, no fixed part"
            )
        else:  # a forward pass: a third of a training sample's work, a quarter where the backward recomputes
            passes = 3 if setup.system.train.activation_checkpointing == "none" else 4
            self.eval_fixed, self.eval_per_sample = 0.0, self.fit.per_sample_s / passes
            self.eval_from = (
                f"1/{passes} of a training sample's time (forward only"
                + ("" if passes == 3 else "; training recomputes the forward: activation checkpointing")
                + "; nothing measured)"
            )

    def comm(self, gpus: int, end: End = 0, gathers: int = 1) -> float:
        s = self.setup
        return comm_seconds(s.params, s.param_bytes, gpus, s.fabric, s.dp_shard, end, gathers).seconds

    def _fit(self, end: End, exposed: float, fixed_share: float) -> StepFit:
        samples = [m.sample for m in self.measured]
        comm = [self.comm(x.gpus, end, x.gathers) for x in samples]
        return fit_steps(samples, comm, exposed, fixed_share)

    def band(self, per_gpu: float, gpus: int, gathers: int) -> tuple[float, float, float]:
        """(step, relative slower, relative faster): each source's ends, two standard deviations, in
        quadrature with the prediction error of the measured noise."""
        step = self.fit.step(per_gpu, self.comm(gpus, 0, gathers))
        ups, downs = [], []
        for fits in self.variants.values():
            ends = [fit.step(per_gpu, self.comm(gpus, end, gathers)) for end, fit in fits] or [step]
            ups.append(max(0.0, max(ends) / step - 1))
            downs.append(max(0.0, step / min(ends) - 1))
        noise = Z * self.fit.prediction_error(per_gpu, self.noise)
        return step, quadrature(noise, *ups), quadrature(noise, *downs)

    def eval_seconds(self, gpus: int) -> float:
        return self.eval_fixed + self.eval_per_sample * self.setup.mlperf.eval_samples / gpus

    def gathers(self, per_gpu: float) -> int:
        """Micro-batches a step at this per-GPU batch on the system (train.micro_batch_size; 'auto': one)."""
        micro = self.setup.system.train.micro_batch_size
        return math.ceil(per_gpu / micro) if isinstance(micro, int) else 1

    def describe(self) -> dict[str, Any]:
        fit = self.fit
        return {
            "fixed_s": fit.fixed_s,
            "fixed_measured": fit.measured_fixed,
            "per_sample_s": fit.per_sample_s,
            "exposed": fit.exposed,
            "exposed_range": list(EXPOSED_RANGE) if self.exposed != OVERLAP_CPU else [OVERLAP_CPU] * 2,
            "residual": fit.residual,
            "measured_per_gpu_batches": list(fit.batches),
            "efficiency": EFFICIENCY,
            "efficiency_range": list(EFFICIENCY_RANGE),
            "measured_gbps": [self.setup.fabric.measured_gbps, self.setup.fabric.measured_out_gbps],
            "measured_range": list(MEASURED_RANGE),
            "parameters": self.setup.params,
            "param_bytes": self.setup.param_bytes,
            "dp_shard": self.setup.dp_shard,
            "convergence_ratio": self.convergence_ratio,
            "convergence_reference_spread": reference_spread()[0],
            "eval_fixed_s": self.eval_fixed,
            "eval_per_sample_s": self.eval_per_sample,
            "eval_from": self.eval_from,
            "band_ends_dropped": self.dropped,
        }

    def row(self, gpus: int, batch: int, batch_from: str = "given", gathers: int | None = None) -> Row:
        """The forecast at gpus and batch; ``gathers``: micro-batches a step (None: the system's)."""
        setup = self.setup
        if batch % gpus:
            raise FluxClusterError(f"global batch {batch} does not split over {gpus} GPUs (a multiple of it)")
        per_gpu = batch / gpus
        gathers = gathers or self.gathers(per_gpu)
        step, slower, faster = self.band(per_gpu, gpus, gathers)
        fit = self.fit
        lo, hi = fit.batches[0], fit.batches[-1]
        outside = per_gpu < lo or per_gpu > hi or (not fit.measured_fixed and per_gpu != lo)

        ref = reference(setup.ruleset, batch)
        doublings = min((abs(math.log2(batch / b)) for b in self.ratio_batches), default=0.0)
        spread, compared = reference_spread()
        low_s, samples, high_s = samples_band(
            ref.mean, ref.stdev, self.convergence_ratio, doublings, systematic=spread
        )
        evals = evaluations(samples, batch, setup.mlperf.eval_interval_samples)
        eval_s = self.eval_seconds(gpus)
        minutes = (samples / batch * step + evals * eval_s) / 60
        up = quadrature(high_s / samples - 1, slower)
        down = quadrature(samples / low_s - 1, faster)
        gpu_hours = minutes * gpus / 60
        comm = comm_seconds(setup.params, setup.param_bytes, gpus, setup.fabric, setup.dp_shard, 0, gathers)
        basis = [
            f"step {step:.3g} s = fixed {fit.fixed_s:.3g} s{'' if fit.measured_fixed else ' (not measured)'}"
            f" + the longer of compute {fit.per_sample_s * 1e3:.3g} ms x {per_gpu:g} per GPU and comm "
            f"{comm.seconds:.3g} s ({comm.text}; sharding {shard_text(setup.dp_shard)}) + {fit.exposed:g} of "
            "the shorter",
            f"samples: RCP {setup.ruleset} {ref.kind} at {batch}: {ref.mean:,.0f} (sd {ref.stdev:,.0f})"
            + (
                f" x {self.convergence_ratio:.3f} (the inputs' convergence vs their RCP, measured "
                f"{doublings:.2g} batch doublings away)"
                if self.ratio_batches
                else " (nothing measured converged: the reference's convergence)"
            )
            + (
                f", up to {high_s:,.0f} (another implementation's or other hyperparameters' convergence: "
                f"the spread between the {' and '.join(compared)} RCP sets, {spread:.1%} sd)"
                if compared
                else f", up to {high_s:,.0f}"
            ),
            f"{evals} evals x {eval_s:.3g} s ({self.eval_from})",
        ]
        if outside:
            basis.append(
                f"extrapolated: {per_gpu:g} per GPU, measured {lo:g}"
                + (f"..{hi:g}" if hi > lo else "")
                + ("" if fit.measured_fixed else " (one per-GPU batch: the fixed part assumed, band widened)")
            )
        if self.dropped:
            basis.append("band ends the measured steps rule out: " + ", ".join(self.dropped))
        return Row(
            gpus=gpus,
            nodes=math.ceil(gpus / setup.system.gpus_per_node),
            global_batch_size=batch,
            per_gpu_batch=per_gpu,
            samples_per_s=batch / step,
            samples_per_s_low=batch / step / (1 + slower),
            samples_per_s_high=batch / step * (1 + faster),
            samples_to_converge=samples,
            samples_to_converge_low=low_s,
            samples_to_converge_high=high_s,
            minutes=minutes,
            minutes_low=minutes / (1 + down),
            minutes_high=minutes * (1 + up),
            gpu_hours=gpu_hours,
            usd=gpu_hours * setup.price if setup.price is not None else None,
            basis="; ".join(basis),
            extrapolated=outside,
            batch_from=batch_from,
        )


def shard_text(dp_shard: DpShard) -> str:
    if dp_shard == "world":
        return "FSDP over every GPU"
    return f"HSDP, shard groups of {dp_shard}" if dp_shard else "HSDP, a node per shard group"


def default_batch(setup: Setup, gpus: int) -> int:
    """The largest batch preset (the workload's) that splits evenly over the GPUs and is at most the
    per-GPU batch a run there takes (Setup.per_gpu_batch) times the GPUs; none: the smallest that splits."""
    fits = [b for b in setup.presets if b % gpus == 0]
    if not fits:
        raise FluxClusterError(
            f"{gpus} GPUs: no batch preset ({', '.join(map(str, setup.presets))}) splits evenly over them; "
            f"give {gpus}:BATCH"
        )
    within = [b for b in fits if b <= setup.per_gpu_batch(gpus) * gpus]
    return max(within) if within else min(fits)


def forecast_rows(
    setup: Setup,
    measured: list[Measured],
    points: list[tuple[int, int | None]],
    targets: list[Measured],
    deadline: float | None,
) -> Forecast:
    """Rows for (GPUs, batch or None: the default) points, then one per target with its actual score."""
    model = StepModel(setup, measured)
    rows = []
    for gpus, batch in points:
        rows.append(model.row(gpus, batch or default_batch(setup, gpus), "given" if batch else "preset"))
    for target in targets:
        if target.score_minutes is None:
            raise FluxClusterError(
                f"{target.path}: no olympic score (too few scored runs): nothing to compare"
            )
        row = model.row(target.sample.gpus, target.global_batch, "target", target.sample.gathers)
        row.target, row.actual_minutes = target.path, target.score_minutes
        row.error = row.minutes / target.score_minutes - 1
        row.inside = row.minutes_low <= target.score_minutes <= row.minutes_high
        row.actual_samples_per_s = target.global_batch / target.sample.step_s
        row.rate_error = row.samples_per_s / row.actual_samples_per_s - 1
        if target.samples_to_converge:
            row.actual_samples_to_converge = target.samples_to_converge
            counted = max(target.samples_to_converge, reference(setup.ruleset, target.global_batch).mean)
            row.samples_error = row.samples_to_converge / counted - 1
        row.basis += off_reference(setup.ruleset, target)
        if (target.tensor_parallelism or 1) > 1:
            row.basis += (
                f"; the target ran tensor parallelism {target.tensor_parallelism} (its logs), the forecast "
                "data-parallel FSDP/HSDP: the comparison is across layouts"
            )
        rows.append(row)
    result = Forecast(
        rows=rows,
        inputs=[_input(m) for m in measured],
        model=model.describe(),
        ruleset=setup.ruleset,
        ruleset_from=setup.ruleset_from,
        system=setup.system.name,
    )
    result.warnings += [
        f"{m.path}: ran tensor parallelism {m.tensor_parallelism} (its logs): its step holds tensor-parallel "
        "communication, and the fit takes it as data-parallel FSDP/HSDP (each GPU gathering every parameter)"
        for m in measured
        if (m.tensor_parallelism or 1) > 1
    ]
    if deadline is not None:
        result.deadline = cheapest_within(rows, deadline)
    return result


def off_reference(ruleset: str, target: Measured) -> str:
    """A basis note where the target trained with other hyperparameters than the RCP it is held to: its
    convergence is then not what the RCP measured (the summarizer only floors it at the RCP mean)."""
    ref = reference(ruleset, target.global_batch)
    rate, warmup = target.hyperparameters
    theirs = (
        ref.hyperparameters.get("opt_base_learning_rate"),
        ref.hyperparameters.get("opt_learning_rate_warmup_steps"),
    )
    if ref.kind != "found" or rate is None or (rate, warmup) == theirs:
        return ""
    return (
        f"; the target trains with LR {rate:g}, warmup {warmup}, the RCP at {ref.batch} with LR "
        f"{theirs[0]:g}, warmup {theirs[1]}: its convergence is outside what the RCP measured"
    )


def _input(m: Measured) -> dict[str, Any]:
    return {
        "path": m.path,
        "kind": m.kind,
        "gpus": m.sample.gpus,
        "global_batch_size": m.global_batch,
        "per_gpu_batch": m.sample.per_gpu_batch,
        "step_s": m.sample.step_s,
        "spread": m.sample.spread,
        "eval_s": m.eval_s,
        "samples_to_converge": m.samples_to_converge,
        "convergence_ratio": m.convergence_ratio,
    }


def cheapest_within(rows: list[Row], deadline: float) -> dict[str, Any]:
    """The cheapest forecast row (USD, else GPU-hours; never a --target's) whose band ends within the
    deadline."""
    rows = [r for r in rows if r.target is None]  # a --target row is a check, not a choice
    on_time = [r for r in rows if r.minutes_high <= deadline]
    out: dict[str, Any] = {"minutes": deadline, "gpus": None, "global_batch_size": None}
    if not on_time:
        fastest = min(rows, key=lambda r: r.minutes_high, default=None)
        out["why"] = f"no point ends within {deadline:g} minutes" + (
            f" (the fastest: {fastest.gpus} GPUs, up to {fastest.minutes_high:.1f})" if fastest else ""
        )
        return out
    best = min(on_time, key=lambda r: (r.usd if r.usd is not None else r.gpu_hours, r.gpus))
    out |= {"gpus": best.gpus, "global_batch_size": best.global_batch_size, "minutes_high": best.minutes_high}
    out["usd"], out["gpu_hours"] = best.usd, best.gpu_hours
    return out
