"""A forecast as a terminal table, JSON, CSV, Markdown or an HTML page with its plot (minutes and cost
against GPUs), through the report's columns, cell escaping and plot style."""

import json
from typing import TYPE_CHECKING, Any

from flux_cluster.atomic import finite_for_json
from flux_cluster.report.forecast.points import Forecast, Row
from flux_cluster.report.formats import Column, _md, _md_table
from flux_cluster.safe_text import csv_text, plain

if TYPE_CHECKING:
    from rich.console import Console

TITLE = "flux-cluster forecast"
PLOT_TITLE = "Forecast: minutes to train and cost per run against GPUs"


def _band(low: str, high: str, fmt: str) -> Any:
    return lambda r: fmt.format(getattr(r, low), getattr(r, high))


COLUMNS = [
    Column("GPUs", lambda r: r.gpus),
    Column("nodes", lambda r: r.nodes),
    Column("global batch", lambda r: r.global_batch_size),
    Column("per GPU", lambda r: r.per_gpu_batch, "{:g}"),
    Column("samples/s", lambda r: r.samples_per_s, "{:,.0f}"),
    Column("samples to converge", lambda r: r.samples_to_converge, "{:,.0f}"),
    Column("minutes", lambda r: r.minutes, "{:,.1f}"),
    Column("band", _band("minutes_low", "minutes_high", "{:,.1f}..{:,.1f}")),
    Column("GPU-hours", lambda r: r.gpu_hours, "{:,.1f}"),
    Column("USD", lambda r: r.usd, "{:,.2f}"),
    Column("official", lambda r: r.actual_minutes, "{:,.2f}"),
    Column("error", lambda r: r.error, "{:+.1%}"),
    Column("in band", lambda r: None if r.inside is None else ("yes" if r.inside else "NO")),
    Column("samples/s error", lambda r: r.rate_error, "{:+.1%}"),
    Column("samples error", lambda r: r.samples_error, "{:+.1%}"),
    Column("extrapolated", lambda r: "yes" if r.extrapolated else None),
]
TARGET_COLUMNS = ("official", "error", "in band", "samples/s error", "samples error")
"""Shown only where there are --target rows: the forecast against the official score, and which part of
it missed (the step model's samples/s, or the convergence)."""
CSV_FIELDS = [
    "gpus", "nodes", "global_batch_size", "per_gpu_batch", "samples_per_s", "samples_per_s_low",
    "samples_per_s_high", "samples_to_converge", "samples_to_converge_low", "samples_to_converge_high",
    "minutes", "minutes_low", "minutes_high", "gpu_hours", "usd", "extrapolated", "batch_from", "target",
    "actual_minutes", "error", "inside", "actual_samples_per_s", "rate_error", "actual_samples_to_converge",
    "samples_error", "basis",
]  # fmt: skip


def _shown(forecast: Forecast) -> list[Column]:
    """The target columns only where there are targets."""
    targets = any(r.target for r in forecast.rows)
    return [c for c in COLUMNS if targets or c.header not in TARGET_COLUMNS]


def _lines(forecast: Forecast) -> list[str]:
    """What the rows rest on, and the deadline's answer, as plain lines."""
    model = forecast.model
    source = (
        "assumed: the logs do not say; give --ruleset"
        if forecast.ruleset_from == "assumed"
        else f"from {forecast.ruleset_from}"
    )
    measured = [
        f"{g:g} GB/s {where}"
        for g, where in zip(model["measured_gbps"], ("within", "across"), strict=True)
        if g
    ]
    links = (
        f"measured bus bandwidth {', '.join(measured)} a scale-up domain (band {model['measured_range'][0]:g}"
        f"..{model['measured_range'][1]:g} of it)"
        if measured
        else f"bandwidth {model['efficiency']:g} of the datasheet (band {model['efficiency_range'][0]:g}.."
        f"{model['efficiency_range'][1]:g})"
    )
    fixed = "" if model["fixed_measured"] else " (one per-GPU batch: not measured, assumed)"
    lines = [
        f"system {forecast.system}; ruleset {forecast.ruleset} ({source}); "
        f"{len(forecast.inputs)} input(s): "
        + ", ".join(sorted({f"{i['kind']} {i['path']}" for i in forecast.inputs})),
        f"step = {model['fixed_s']:.3g} s{fixed} + the longer of {model['per_sample_s'] * 1e3:.3g} ms per "
        f"sample per GPU and communication + {model['exposed']:g} of the shorter (band "
        f"{model['exposed_range'][0]:g}..{model['exposed_range'][1]:g}); communication: "
        f"{model['parameters']:,} parameters, {model['param_bytes']} bytes each, {links}; fit residual "
        f"{model['residual']:.1%}",
    ]
    for row in forecast.rows:
        name = f"target {row.target}" if row.target else f"{row.gpus} GPUs"
        lines.append(f"{name}: {row.basis}")
    if forecast.deadline:
        lines.append(deadline_text(forecast.deadline))
    return lines + [f"warning: {w}" for w in forecast.warnings]


def deadline_text(deadline: dict[str, Any]) -> str:
    if deadline.get("gpus") is None:
        return f"deadline {deadline['minutes']:g} minutes: {deadline['why']}"
    cost = (
        f"${deadline['usd']:,.2f}"
        if deadline.get("usd") is not None
        else f"{deadline['gpu_hours']:,.1f} GPU-hours"
    )
    return (
        f"deadline {deadline['minutes']:g} minutes: the cheapest point that ends in time (its band's top "
        f"{deadline['minutes_high']:.1f}) is {deadline['gpus']} GPUs at global batch "
        f"{deadline['global_batch_size']}, {cost}"
    )


def print_forecast(forecast: Forecast, console: "Console") -> None:
    from rich.table import Table

    from flux_cluster.console import print_table

    columns = _shown(forecast)
    table = Table(title=f"{TITLE} ({forecast.system}, ruleset {forecast.ruleset})", title_justify="left")
    for column in columns:
        table.add_column(column.header, justify="right")
    for row in forecast.rows:
        table.add_row(*(plain(c.text(row)) for c in columns))
    print_table(console, table)
    for line in _lines(forecast):
        console.print(plain(line), soft_wrap=True)


def render_json(forecast: Forecast) -> str:
    return json.dumps(finite_for_json(forecast.to_json()), indent=2, allow_nan=False) + "\n"


def render_csv(forecast: Forecast) -> str:
    """One row per point, the JSON names as headers (safe_text.csv_text: no formula, no control character)."""
    rows = ({name: getattr(row, name) for name in CSV_FIELDS} for row in forecast.rows)
    return csv_text(rows, CSV_FIELDS)


def render_markdown(forecast: Forecast) -> str:
    lines = [f"# {TITLE}", "", *_md_table(_shown(forecast), forecast.rows), ""]
    lines += [f"- {_md(line)}" for line in _lines(forecast)]
    return "\n".join(lines) + "\n"


def plot(rows: list[Row]) -> str:
    """Minutes (with the band) and USD per run (or GPU-hours) against GPUs, as inline SVG."""
    from matplotlib.ticker import NullLocator

    from flux_cluster.report import plots

    with plots.report_figure(PLOT_TITLE) as (figure, axes):
        ordered = sorted((r for r in rows if not r.target), key=lambda r: r.gpus)
        targets = [r for r in rows if r.target]
        for group, marker, label in ((ordered, "o", "forecast"), (targets, "s", "forecast of a target")):
            if not group:
                continue
            xs = [r.gpus for r in group]
            low = [r.minutes - r.minutes_low for r in group]
            high = [r.minutes_high - r.minutes for r in group]
            axes.errorbar(xs, [r.minutes for r in group], yerr=[low, high], marker=marker, capsize=3,
                          linestyle="-" if group is ordered else "none", label=f"{label} (band)")  # fmt: skip
        if targets:
            axes.scatter([r.gpus for r in targets], [r.actual_minutes for r in targets], marker="*", s=80,
                         color="black", zorder=3, label="official score")  # fmt: skip
        axes.set_xscale("log", base=2)
        counts = sorted({r.gpus for r in rows})
        axes.set_xticks(counts, labels=[str(c) for c in counts])
        axes.xaxis.set_minor_locator(NullLocator())
        axes.set_xlabel("GPUs")
        axes.set_ylabel("minutes to train")
        axes.set_ylim(bottom=0)
        costs = [(r.gpus, r.usd if r.usd is not None else r.gpu_hours) for r in ordered]
        if costs:
            twin = axes.twinx()
            twin.plot(*zip(*costs, strict=True), color="#8a5300", linestyle="--", marker=".", label="cost")
            twin.set_ylabel("USD per run" if ordered[0].usd is not None else "GPU-hours per run")
            twin.set_ylim(bottom=0)
            twin.grid(False)
            twin.legend(loc="upper right", bbox_to_anchor=(1.0, 0.82), fontsize=7)
        axes.legend(loc="upper right", fontsize=7)
        return plots.figure_svg(figure)


def render_html(forecast: Forecast) -> str:
    from flux_cluster import __version__
    from flux_cluster.report.html import template

    return template("forecast.html.j2").render(
        title=TITLE,
        forecast=forecast,
        columns=_shown(forecast),
        lines=_lines(forecast),
        plot=plot(forecast.rows) if forecast.rows else None,
        version=__version__,
    )
