"""Forecasts: flux1 time-to-train, GPU-hours and cost at any GPU count, from a throughput sweep on one
node, flux-cluster runs or published MLPerf results (flux_cluster/report/forecast/)."""

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from flux_cluster.errors import FluxClusterError

if TYPE_CHECKING:
    from flux_cluster.report.forecast.inputs import Measured
    from flux_cluster.report.forecast.points import Forecast

Point = int | tuple[int, int]
"""A GPU count (the batch: the default for that scale) or (GPUs, global batch)."""


def forecast(
    sources: Sequence[Path | str],
    *,
    system: str,
    gpus: Sequence[Point] = (),
    global_batch_size: int | None = None,
    targets: Sequence[Path | str] = (),
    ruleset: str | None = None,
    dp_shard: int | Literal["world"] | None = None,
    bandwidth: float | None = None,
    inter_bandwidth: float | None = None,
    price: float | None = None,
    deadline: float | None = None,
    check: bool = False,
    overrides: Sequence[str] = (),
) -> "Forecast":
    """flux-cluster forecast: fit the step time to ``sources`` (throughput sweeps, result folders, run
    directories) and forecast minutes, GPU-hours and cost at each of ``gpus`` (and at each target's own
    GPUs and batch, beside its official score). ``system`` (with ``overrides``, KEY=VALUE) gives GPUs per
    node, the interconnect, the sharding, the model and the price; ``dp_shard``: the shard group ('world':
    plain FSDP over every GPU; None: the system's train.dp_shard); ``bandwidth``: a measured bus bandwidth
    in GB/s within one scale-up domain (NVLink), ``inter_bandwidth``: across domains (the NICs);
    ``check``: run the compliance checker on result logs (the summarizer drops failing runs).
    Bad input: one-line FluxClusterError."""
    from flux_cluster.api.runs import load_system
    from flux_cluster.report.forecast.inputs import read_inputs, read_results
    from flux_cluster.report.forecast.points import forecast_rows, make_setup

    if not sources:
        raise FluxClusterError(
            "forecast: give --from (a throughput sweep, result folders or run directories)"
        )
    if not gpus and not targets:
        raise FluxClusterError("forecast: give --gpus N[,N...] (or N:BATCH), or --target RESULTS_DIR")
    for flag, value in (("--bandwidth", bandwidth), ("--inter-bandwidth", inter_bandwidth)):
        if value is not None and not value > 0:
            raise FluxClusterError(f"{flag} {value}: expected GB/s > 0")
    if price is not None and not price >= 0:
        raise FluxClusterError(f"--price {price}: expected USD per GPU-hour >= 0")
    if deadline is not None and not deadline > 0:
        raise FluxClusterError(f"--deadline {deadline}: expected minutes > 0")
    config = load_system(system, overrides)
    measured = read_inputs([Path(p) for p in sources], ruleset, check)
    aimed = read_results([Path(p) for p in targets], ruleset, check) if targets else []
    chosen, source = _ruleset(ruleset, measured + aimed, config.mlperf.ruleset)
    setup = make_setup(
        config,
        dp_shard=dp_shard,
        bandwidth=(bandwidth, inter_bandwidth),
        ruleset=chosen,
        ruleset_from=source,
        price=price,
    )
    _check_models(measured, setup.model, system)
    points = [(p, global_batch_size) if isinstance(p, int) else p for p in gpus]
    for count, batch in points:
        if count < 1 or (batch is not None and batch < 1):
            given = f"{count}" if batch is None else f"{count}:{batch}"
            raise FluxClusterError(f"--gpus {given}: expected GPUs >= 1 (and a batch >= 1: N:BATCH)")
    result = forecast_rows(setup, measured, points, aimed, deadline)
    result.warnings += [w for m in measured + aimed for w in m.warnings if w.startswith("ruleset")]
    return result


def _ruleset(given: str | None, measured: "list[Measured]", configured: str) -> tuple[str, str]:
    """--ruleset, else the result logs' (as the report resolves them: one, or a line asking for
    --ruleset), else the system's mlperf.ruleset (sweeps alone)."""
    if given:
        return given, "--ruleset"
    read = {(m.ruleset, m.ruleset_from) for m in measured if m.kind == "results" and m.ruleset}
    rulesets = {r for r, _ in read}
    if len(rulesets) > 1:
        found = ", ".join(f"{r} (from {s})" for r, s in sorted(read, key=str))
        raise FluxClusterError(f"the result logs read as different rulesets ({found}): give --ruleset")
    if rulesets:
        chosen = rulesets.pop()
        return chosen, next(s for r, s in read if r == chosen) or "logs"
    return configured, "system config"


def _check_models(measured: "list[Measured]", model: str, system: str) -> None:
    for m in measured:
        if m.model is not None and m.model != model:
            raise FluxClusterError(
                f"{m.path}: trained model {m.model!r}, but system {system} trains {model!r}: forecast the "
                f"model that was measured (--set train.model={m.model})"
            )
