"""flux-cluster report SWEEP_FOLDER: a sweep's points sorted by throughput, the best point per node count,
and plots (samples/s per GPU against micro-batch size, one line per variant; scaling against node count).
No torch; matplotlib only for the HTML page."""

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flux_cluster.launch.sweep_state import SweepState, summary_columns, summary_rows

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA_VERSION = 1
MICRO_BATCH = "train.micro_batch_size"
NODES = "nodes"
_SHOWN = (
    ("samples_per_s", "samples/s", "{:,.2f}"),
    ("samples_per_s_per_gpu", "per GPU", "{:,.2f}"),
    ("step_time_ms_p50", "step p50 ms", "{:,.1f}"),
    ("step_time_ms_p90", "step p90 ms", "{:,.1f}"),
    ("mfu", "MFU", "{:.1%}"),
    ("peak_memory_gb", "peak mem GB", "{:,.2f}"),
    ("gpu_hours", "GPU-hours", "{:.4g}"),
    ("usd_per_million_samples", "USD/M samples", "{:,.2f}"),
)


@dataclass(frozen=True)
class SweepReport:
    """A sweep as the report shows it; rows are runs_summary.csv's, fastest first."""

    folder: str
    name: str
    system: str
    job: str
    grid: dict[str, list[str]]
    columns: list[str]
    rows: list[dict[str, Any]]
    """ok points by samples/s, fastest first, then the rest (oom, failed, running, pending) by point."""
    best: list[dict[str, Any]]
    """The fastest ok point of each node count, fewest nodes first."""

    def to_json(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "name": self.name,
            "system": self.system,
            "job": self.job,
            "grid": self.grid,
            "points": self.rows,
            "best": self.best,
        }


def node_count(row: dict[str, Any], state: SweepState, index: int) -> int:
    """The point's node count: its grid value, else what its record says, else 1."""
    if NODES in row:
        return int(row[NODES])
    return int(state.points[index].result.get("nodes") or 1)


def build_report(folder: Path, state: SweepState) -> SweepReport:
    rows = summary_rows(state)
    for row in rows:
        row[NODES] = node_count(row, state, row["point"])
    ok = sorted((r for r in rows if _ok(r)), key=lambda r: -r["samples_per_s"])
    rest = [r for r in rows if not _ok(r)]
    best: dict[int, dict[str, Any]] = {}
    for row in ok:
        best.setdefault(row[NODES], row)
    columns = summary_columns(state)
    if NODES not in columns:
        columns.insert(columns.index("status"), NODES)
    return SweepReport(
        folder=str(folder),
        name=state.name,
        system=state.system,
        job=state.job,
        grid=state.grid,
        columns=columns,
        rows=ok + rest,
        best=[best[n] for n in sorted(best)],
    )


def _ok(row: dict[str, Any]) -> bool:
    return row["status"] == "ok" and row["samples_per_s"] is not None


def sweep_report(folder: Path) -> SweepReport:
    """The sweep in folder as it stands now (running points read again from their run directories)."""
    from flux_cluster.launch.sweep import refresh

    return build_report(folder, refresh(folder))


def sweep_document(reports: list[SweepReport]) -> dict[str, Any]:
    """The JSON document: {'schema_version': 1, 'sweeps': [{folder, name, system, job, grid, points,
    best}]}, a point being a runs_summary.csv row with numbers as numbers and empty values as null."""
    return {"schema_version": SCHEMA_VERSION, "sweeps": [r.to_json() for r in reports]}


def render_json(reports: list[SweepReport]) -> str:
    from flux_cluster.report.formats import finite_for_json

    return json.dumps(finite_for_json(sweep_document(reports)), indent=2, allow_nan=False) + "\n"


def render_csv(reports: list[SweepReport]) -> str:
    """Every sweep's rows, fastest first, with a leading 'sweep' column."""
    columns = ["sweep"]
    for report in reports:
        columns += [c for c in report.columns if c not in columns]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for report in reports:
        for row in report.rows:
            writer.writerow({"sweep": report.name, **{k: "" if v is None else v for k, v in row.items()}})
    return out.getvalue()


def _cell(row: dict[str, Any], key: str, pattern: str = "{}") -> str:
    value = row.get(key)
    if value is None or value == "":
        return "-"
    return pattern.format(value) if isinstance(value, int | float) else str(value)


def _table_columns(report: SweepReport) -> list[tuple[str, str, str]]:
    varied = [(key, key.rsplit(".", 1)[-1], "{}") for key in report.grid]
    if NODES not in report.grid:
        varied.append((NODES, NODES, "{}"))
    return [("point", "point", "{}"), *varied, ("status", "status", "{}"), *_SHOWN]


def print_sweep(report: SweepReport, console: "Console") -> None:
    from rich.table import Table

    from flux_cluster.console import print_table

    columns = _table_columns(report)
    table = Table(title=f"sweep {report.name} on {report.system} ({report.job}), fastest first")
    for _, title, _ in columns:
        table.add_column(title, justify="right" if title not in ("status",) else "left")
    for row in report.rows:
        table.add_row(*(_cell(row, key, pattern) for key, _, pattern in columns))
    print_table(console, table)
    if report.best:
        best = Table(title="best point per node count")
        for _, title, _ in columns:
            best.add_column(title, justify="right")
        for row in report.best:
            best.add_row(*(_cell(row, key, pattern) for key, _, pattern in columns))
        print_table(console, best)
    for row in report.rows:
        if row.get("error"):
            console.print(
                f"point {row['point']}: {row['status']}: {row['error']}", markup=False, highlight=False
            )


def render_markdown(reports: list[SweepReport]) -> str:
    lines: list[str] = []
    for report in reports:
        columns = _table_columns(report)
        lines += [f"## Sweep {report.name} on {report.system} ({report.job})", ""]
        for title, rows in (
            ("Points, fastest first", report.rows),
            ("Best point per node count", report.best),
        ):
            lines += [f"### {title}", "", "| " + " | ".join(t for _, t, _ in columns) + " |"]
            lines.append("|" + "---|" * len(columns))
            for row in rows:
                cells = (_cell(row, key, pattern).replace("|", "\\|") for key, _, pattern in columns)
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def _variant(row: dict[str, Any], report: SweepReport) -> str:
    others = [k for k in report.grid if k not in (MICRO_BATCH, NODES)]
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={row[k]}" for k in others) or "all points"


def micro_batch_plot(report: SweepReport) -> str | None:
    """samples/s per GPU against micro-batch size, one line per variant (and node count); None when the
    micro-batch size was not varied."""
    if MICRO_BATCH not in report.grid or len(report.grid[MICRO_BATCH]) < 2:
        return None
    from flux_cluster.report.plots import figure_svg, report_figure

    with report_figure("Throughput per GPU vs micro-batch size") as (figure, axes):
        lines: dict[str, list[tuple[int, float]]] = {}
        failed: list[str] = []
        for row in report.rows:
            label = _variant(row, report) + (f", {row[NODES]} nodes" if NODES in report.grid else "")
            if _ok(row) and row["samples_per_s_per_gpu"] is not None:
                lines.setdefault(label, []).append((int(row[MICRO_BATCH]), row["samples_per_s_per_gpu"]))
            else:
                failed.append(f"micro-batch {row[MICRO_BATCH]} ({label}): {row['status']}")
        for label, points in sorted(lines.items()):
            xs, ys = zip(*sorted(points), strict=True)
            axes.plot(xs, ys, marker="o", label=label)
        axes.set_xscale("log", base=2)
        axes.set_ylabel("samples/s per GPU")
        if lines:
            axes.legend(fontsize=7)
        axes.set_xlabel("micro-batch size" + "".join(f"\nnot shown: {f}" for f in failed))
        return figure_svg(figure)


def scaling_plot(report: SweepReport) -> str | None:
    """Best samples/s against node count, with the ideal line from the fewest nodes; None for one count."""
    if len(report.best) < 2:
        return None
    from flux_cluster.report.plots import figure_svg, report_figure

    with report_figure("Scaling: best samples/s vs nodes") as (figure, axes):
        nodes = [row[NODES] for row in report.best]
        speed = [row["samples_per_s"] for row in report.best]
        axes.plot(nodes, speed, marker="o", label="best point")
        axes.plot(nodes, [speed[0] * n / nodes[0] for n in nodes], linestyle="--", label="ideal (linear)")
        axes.set_xlabel("nodes")
        axes.set_ylabel("samples/s")
        axes.legend(fontsize=7)
        return figure_svg(figure)


def render_html(reports: list[SweepReport]) -> str:
    import jinja2

    from flux_cluster import __version__

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("flux_cluster.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    sections = []
    for report in reports:
        plots = [p for p in (micro_batch_plot(report), scaling_plot(report)) if p is not None]
        sections.append((report, _table_columns(report), plots))
    return environment.get_template("sweep.html.j2").render(
        sections=sections, cell=_cell, version=__version__
    )
