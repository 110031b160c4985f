"""flux-cluster report SWEEP_FOLDER: a sweep's points, fastest first, the best point per node count and two
plots (samples/s per GPU against micro-batch size; best samples/s against node count), as a terminal table,
JSON, CSV, Markdown or an HTML page. No torch here; matplotlib and jinja2 only for the page.

The JSON document (``schema_version`` 1)::

    {"schema_version": 1,
     "sweeps": [                     # one per sweep folder, in the order given
       {"folder": str, "name": str, "system": str, "job": "throughput" | "train",
        "grid": {key: [value, ...]},  # as the sweep was given it (values are strings)
        "varied": [key, ...],         # the grid keys with more than one value
        "points": [point, ...],       # ok points by samples/s, fastest first; then the others by status
        "best": [point, ...]}]}       # the fastest ok point of each node count, fewest nodes first

A point is a runs_summary.csv row as numbers and strings (``point``, each grid key, ``status``, the
throughput figures, ``gpus``, ``gpu_hours``, ``cost_usd``, ``usd_per_million_samples``, ``run_dir``,
``error``; null where unknown) and ``nodes``, always its node count as an integer: the grid's value when
``nodes`` is a grid key, else the run's record, else 1.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flux_cluster.errors import FluxClusterError
from flux_cluster.report.columns import Column, format_metric, format_ratio, print_comparison, terminal_table
from flux_cluster.report.formats import HF_COMPARISON_TITLE, comparison_markdown
from flux_cluster.report.hf import COMPARED_KEYS, compared_metrics, one_change_pairs, shown
from flux_cluster.sweepdir import (
    SUMMARY_FLOAT,
    SWEEP_FILE,
    Point,
    SweepState,
    summary_columns,
    summary_rows,
)

if TYPE_CHECKING:
    from rich.console import Console

    from flux_cluster.report.plots import Plot

SCHEMA_VERSION = 1
MICRO_BATCH = "train.micro_batch_size"
NODES = "nodes"
STATUS_ORDER = ("ok", "not converged", "oom", "failed", "running", "pending")
"""After the ok points: finished ones first, then those still without an answer; unknown ones last."""
MICRO_BATCH_TITLE = "Throughput per GPU vs micro-batch size"
SCALING_TITLE = "Scaling: best samples/s vs nodes"
BEST_TITLE = "Best point per node count"


@dataclass(frozen=True)
class SweepReport:
    """A sweep as the report shows it (see the module's docstring for the JSON form)."""

    folder: str
    name: str
    system: str
    job: str
    grid: dict[str, list[str]]
    varied: list[str]
    """The grid keys with more than one value."""
    columns: list[str]
    """runs_summary.csv's columns."""
    rows: list[dict[str, Any]]
    """ok points by samples/s, fastest first, then the others by status (STATUS_ORDER), then point."""
    best: list[dict[str, Any]]
    """The fastest ok point of each node count, fewest nodes first (never an oom or failed one)."""
    state: SweepState = field(repr=False, compare=False)
    """The sweep, its points in the order of rows (for the CSV, written as runs_summary.csv is)."""

    def to_json(self) -> dict[str, Any]:
        document = {
            "folder": self.folder,
            "name": self.name,
            "system": self.system,
            "job": self.job,
            "grid": self.grid,
            "varied": self.varied,
            "points": self.rows,
            "best": self.best,
        }
        pairs = comparisons(self)
        return document | ({"comparisons": pairs} if pairs else {})


def build_report(folder: Path, state: SweepState) -> SweepReport:
    pairs = list(zip(state.points, summary_rows(state), strict=True))
    for point, row in pairs:
        row[NODES] = _node_count(folder, point)
    ok = sorted((pair for pair in pairs if _ok(pair[1])), key=lambda pair: -pair[1]["samples_per_s"])
    rest = sorted((pair for pair in pairs if not _ok(pair[1])), key=lambda pair: _rank(pair[1]))
    ordered = ok + rest
    best: dict[int, dict[str, Any]] = {}
    for _, row in ok:
        best.setdefault(row[NODES], row)  # the first is the fastest
    return SweepReport(
        folder=str(folder),
        name=state.name,
        system=state.system,
        job=state.job,
        grid=state.grid,
        varied=[key for key, values in state.grid.items() if len(values) > 1],
        columns=summary_columns(state),
        rows=[row for _, row in ordered],
        best=[best[n] for n in sorted(best)],
        state=replace(state, points=[point for point, _ in ordered]),
    )


def _ok(row: dict[str, Any]) -> bool:
    return row["status"] == "ok" and row["samples_per_s"] is not None


def _rank(row: dict[str, Any]) -> tuple[int, int]:
    status = row["status"]
    return (STATUS_ORDER.index(status) if status in STATUS_ORDER else len(STATUS_ORDER), row["point"])


def _node_count(folder: Path, point: Point) -> int:
    """The grid's nodes value, else the run's record (a throughput record says how many), else 1."""
    value = point.values[NODES] if NODES in point.values else point.result.get("nodes") or 1
    if isinstance(value, str) and value.strip().isdecimal():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FluxClusterError(
            f"{folder / SWEEP_FILE}: point {point.index}: nodes {value!r}, expected a whole number >= 1"
        )
    return value


# Formatting -------------------------------------------------------------------------------------------


def _value(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda row: row.get(key)


SWEEP_PRIORITY = ("samples/s", "samples/s/GPU", "MFU", "USD/M samples", "peak mem GB", "step p50 ms", "GPU-h")
"""After the point, its grid values and status: the terminal's columns, the most important first."""


def table_columns(report: SweepReport) -> list[Column]:
    """The columns of the tables; terminal=False ones only in Markdown and HTML (the terminal is narrow)."""
    keys = [key for key in report.grid if key != NODES]
    short = [key.rsplit(".", 1)[-1] for key in keys]
    return [
        Column("point", _value("point")),
        *(  # a key's last part unless two keys share it (model.compile, train.compile)
            Column(name if short.count(name) == 1 else key, _value(key))
            for key, name in zip(keys, short, strict=True)
        ),
        Column("nodes", _value(NODES)),
        Column("status", _value("status")),
        Column("samples/s", _value("samples_per_s"), "{:,.2f}"),
        Column("samples/s/GPU", _value("samples_per_s_per_gpu"), "{:,.2f}"),
        Column("step p50 ms", _value("step_time_ms_p50"), "{:,.1f}"),
        Column("step p99 ms", _value("step_time_ms_p99"), "{:,.1f}", terminal=False),
        Column("TFLOP/s/GPU", _value("tflops_per_gpu"), "{:,.1f}", terminal=False),
        Column("MFU", _value("mfu"), "{:.1%}"),
        Column("peak mem GB", _value("peak_memory_gb"), "{:,.1f}"),
        Column("data wait ms", _value("data_wait_ms"), "{:,.1f}", terminal=False),
        Column("GPU-h", _value("gpu_hours"), "{:.3g}"),
        Column("USD/M samples", _value("usd_per_million_samples"), "{:,.2f}"),
    ]


SWEEP_FIGURES: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("samples/s", _value("samples_per_s")),
    ("samples/s/GPU", _value("samples_per_s_per_gpu")),
    ("step p50 ms", _value("step_time_ms_p50")),
    ("TFLOP/s/GPU", _value("tflops_per_gpu")),
    ("MFU", _value("mfu")),
    ("peak mem GB", _value("peak_memory_gb")),
    ("GPU-h", _value("gpu_hours")),
    ("USD/M samples", _value("usd_per_million_samples")),
]
COMPARISON_NOTE = (
    "Every two points that ran to the end and differ in one of the grid's train.parallel, train.precision, "
    "train.mode or train.micro_batch_size alone, side by side: A the baseline (DP, FP32, full fine-tuning, "
    "the smaller micro-batch), B/A the ratio"
)


def comparisons(report: SweepReport) -> list[dict[str, Any]]:
    """Seed 002's comparison tables for a sweep whose grid varies train.parallel, train.precision or
    train.mode (a micro-batch sweep alone has its plot): every two ok points that differ in one compared
    key alone, in the shape of report.compare's pairs plus the key and a title ('FP32 vs AMP-BF16')."""
    compared = {key: key for key in COMPARED_KEYS if key in report.varied}
    if not compared.keys() - {MICRO_BATCH}:
        return []
    ok = [row for row in report.rows if _ok(row)]

    def settings(row: dict[str, Any]) -> dict[str, Any]:
        return {key: row.get(key) for key in report.grid} | {NODES: row[NODES]}

    pairs = []
    for key, a, b in one_change_pairs(ok, settings, compared):
        x, y = shown(key, a[key]), shown(key, b[key])
        pairs.append(
            {
                "key": key,
                "title": f"{x} vs {y}",
                "a_name": f"{x}: point {a['point']}",
                "b_name": f"{y}: point {b['point']}",
                "a_path": a.get("run_dir") or "",
                "b_path": b.get("run_dir") or "",
                "metrics": compared_metrics(a, b, SWEEP_FIGURES),
            }
        )
    return pairs


def _title(report: SweepReport) -> str:
    return f"Sweep {report.name} on {report.system} ({report.job})"


def _reasons(report: SweepReport) -> list[str]:
    """Why each point that did not run to the end ended, one line each."""
    return [f"point {r['point']}: {r['status']}: {r['error']}" for r in report.rows if r.get("error")]


def print_sweep(report: SweepReport, console: "Console", wide: bool = False) -> None:
    """The points and the best per node count as tables (report.columns.terminal_table: compact, fitted to
    the window, or --wide), then each failure's reason."""
    from flux_cluster.safe_text import plain

    columns = table_columns(report)
    headers = [c.header for c in columns]
    priority = [*headers[: headers.index("status") + 1], *SWEEP_PRIORITY]  # point, grid values, status first
    for title, rows in ((f"{_title(report)}: points, fastest first", report.rows), (BEST_TITLE, report.best)):
        terminal_table(
            console,
            plain(title),
            columns,
            rows,
            left=("status",),
            priority=priority,
            wide=wide,
            dim=lambda row: row["status"] != "ok",
        )
    if not report.best:
        console.print("no point ran to the end (status ok): no best point", highlight=False)
    for line in _reasons(report):
        console.print(plain(line), soft_wrap=True)
    pairs = comparisons(report)
    if pairs:
        console.print(f"{HF_COMPARISON_TITLE}: {COMPARISON_NOTE}.", soft_wrap=True, highlight=False)
        print_comparison({"pairs": pairs, "unmatched": []}, console)


def render_json(reports: list[SweepReport]) -> str:
    import json

    return json.dumps(sweep_document(reports), indent=2, allow_nan=False) + "\n"


def sweep_document(reports: list[SweepReport]) -> dict[str, Any]:
    """The JSON document (see the module's docstring); NaN and infinities as null."""
    from flux_cluster.atomic import finite_for_json

    return finite_for_json({"schema_version": SCHEMA_VERSION, "sweeps": [r.to_json() for r in reports]})


def render_csv(reports: list[SweepReport]) -> str:
    """One sweep: runs_summary.csv's columns and cells. Several: a leading 'sweep' column (the sweep's
    name) and every sweep's columns. Written as every CSV of flux-cluster is (safe_text.csv_text)."""
    from flux_cluster.safe_text import csv_text

    several = len(reports) > 1
    columns = ["sweep"] if several else []
    for report in reports:
        columns += [c for c in report.columns if c not in columns]
    rows = [
        {"sweep": report.name, **row} if several else row
        for report in reports
        for row in summary_rows(report.state)
    ]
    return csv_text(rows, columns, float_format=SUMMARY_FLOAT)


def render_markdown(reports: list[SweepReport]) -> str:
    from flux_cluster.report.formats import _md, _md_table

    lines = ["# flux-cluster sweep report"]
    for report in reports:
        columns = table_columns(report)
        lines += ["", f"## {_md(_title(report))}", "", f"folder: {_md(report.folder)}", ""]
        lines += ["### Points, fastest first", "", *_md_table(columns, report.rows), ""]
        lines += [f"### {BEST_TITLE}", ""]
        lines += _md_table(columns, report.best) if report.best else ["No point ran to the end (status ok)."]
        lines += [""] + [f"- {_md(line)}" for line in _reasons(report)]
        pairs = comparisons(report)
        if pairs:
            lines += ["", f"### {HF_COMPARISON_TITLE}", "", COMPARISON_NOTE + "."]
            lines += [*comparison_markdown({"a": "", "b": "", "pairs": pairs, "unmatched": []})[1:], ""]
    return "\n".join(lines).rstrip("\n") + "\n"


# Plots ------------------------------------------------------------------------------------------------


def _size(value: object) -> float | None:
    """A micro-batch size as a number, or None where a grid value is not one."""
    try:
        number = float(str(value))
    except ValueError:
        return None
    return number if 0 < number < float("inf") else None


def _variant(row: dict[str, Any], report: SweepReport, by_nodes: bool) -> str:
    """The point's values of the varied keys other than micro-batch and nodes (one line each); its node
    count too where several ran, since samples/s per GPU differs between them."""
    parts = [f"{k.rsplit('.', 1)[-1]}={row.get(k)}" for k in report.varied if k not in (MICRO_BATCH, NODES)]
    if by_nodes:
        parts.append(f"{row[NODES]} node{'s' if row[NODES] > 1 else ''}")
    return ", ".join(parts) or "all points"


def micro_batch_plot(report: SweepReport) -> "Plot | None":
    """samples/s per GPU against micro-batch size, one line per variant; oom and failed points an x on
    the x axis. None when the micro-batch size was not varied, or a value of it is not a number."""
    if MICRO_BATCH not in report.varied:
        return None
    sizes = [_size(row.get(MICRO_BATCH)) for row in report.rows]
    if any(size is None for size in sizes):
        return None
    from matplotlib.ticker import NullLocator

    from flux_cluster.report import plots

    by_nodes = len({row[NODES] for row in report.rows}) > 1
    lines: dict[str, list[tuple[float, float]]] = {}
    crosses: dict[str, list[float]] = {}
    left_out = []
    for row, size in zip(report.rows, sizes, strict=True):
        label = _variant(row, report, by_nodes)
        lines.setdefault(label, [])  # a variant none of whose points ran still gets its colour and key
        if _ok(row) and row["samples_per_s_per_gpu"] is not None:
            lines[label].append((size, row["samples_per_s_per_gpu"]))
            continue
        left_out.append(f"micro-batch {row.get(MICRO_BATCH)}, {label}: {row['status']}")
        if row["status"] in ("oom", "failed"):
            crosses.setdefault(label, []).append(size)
    with plots.report_figure(MICRO_BATCH_TITLE) as (figure, axes):
        for label, points in sorted(lines.items()):
            xs, ys = zip(*sorted(points), strict=True) if points else ((), ())
            (line,) = axes.plot(xs, ys, marker="o", label=plots._plain(label))
            if label in crosses:  # on the axis itself: an oom point has no throughput to draw
                bad = crosses[label]
                axes.scatter(bad, [0] * len(bad), marker="x", s=60, color=line.get_color(), clip_on=False)
        axes.set_xscale("log", base=2)
        ticks = sorted(set(sizes))
        axes.set_xticks(ticks, labels=[f"{t:g}" for t in ticks])
        axes.xaxis.set_minor_locator(NullLocator())
        axes.set_ylim(bottom=0)
        axes.set_ylabel("samples/s per GPU")
        axes.legend(fontsize=7)
        plots._left_out(axes, left_out, "micro-batch size (x on the axis: out of memory or failed)")
        return plots.Plot(MICRO_BATCH_TITLE, plots.figure_svg(figure))


def scaling_plot(report: SweepReport) -> "Plot | None":
    """The best point's samples/s against node count, with the ideal (linear from the fewest nodes) and
    each point's scaling efficiency. None unless two or more node counts have an ok point."""
    if len(report.best) < 2:
        return None
    from flux_cluster.report import plots

    nodes = [row[NODES] for row in report.best]
    speed = [row["samples_per_s"] for row in report.best]
    ideal = [speed[0] * n / nodes[0] for n in nodes]
    without = sorted({row[NODES] for row in report.rows} - set(nodes))
    with plots.report_figure(SCALING_TITLE) as (figure, axes):
        axes.plot(nodes, ideal, linestyle="--", color="#888888", label=f"ideal: linear from {nodes[0]}")
        axes.plot(nodes, speed, marker="o", label="best point of each node count")
        for n, s, i in zip(nodes, speed, ideal, strict=True):
            axes.annotate(f"{s / i:.0%}", (n, s), textcoords="offset points", xytext=(4, -12), fontsize=8)
        axes.set_xticks(nodes, labels=[str(n) for n in nodes])
        axes.set_xlim(left=0)
        axes.set_ylim(bottom=0)
        axes.set_ylabel("samples/s (labels: % of the ideal)")
        axes.legend(fontsize=7)
        plots._left_out(axes, [f"{n} nodes: no point ran to the end" for n in without], "nodes")
        return plots.Plot(SCALING_TITLE, plots.figure_svg(figure))


def sweep_plots(report: SweepReport) -> "list[Plot]":
    """The plots that can be drawn for this sweep (none, one or both)."""
    return [plot for plot in (micro_batch_plot(report), scaling_plot(report)) if plot is not None]


def render_html(reports: list[SweepReport]) -> str:
    from flux_cluster import __version__
    from flux_cluster.report.html import template

    sections = [
        (report, table_columns(report), sweep_plots(report), comparisons(report)) for report in reports
    ]
    return template("sweep.html.j2").render(
        sections=sections,
        title=_title,
        reasons=_reasons,
        best_title=BEST_TITLE,
        version=__version__,
        comparison_title=HF_COMPARISON_TITLE,
        comparison_note=COMPARISON_NOTE,
        metric=format_metric,
        ratio=format_ratio,
    )
