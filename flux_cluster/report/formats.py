"""The report as a terminal table, JSON, CSV or Markdown. One list of columns serves all of them."""

import csv
import html
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flux_cluster.report.scoring import GroupResult
from flux_cluster.safe_text import plain, printable

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[Any], Any]
    fmt: str = "{}"
    terminal: bool = True
    """Shown in the terminal table too (which must fit a screen); every format has the rest."""

    def text(self, row: Any) -> str:
        value = self.value(row)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return self.fmt.format(value)


def _name(group: GroupResult) -> str:
    return group.system or Path(group.path).name


def _runs(group: GroupResult) -> str:
    return f"{group.scored_runs}/{group.run_count}"


GROUP_COLUMNS = [
    Column("system", _name),
    Column("benchmark", lambda g: g.benchmark, terminal=False),
    Column("accelerators", lambda g: g.accelerators),
    Column("runs scored", _runs),
    Column("olympic minutes", lambda g: g.olympic_minutes, "{:.2f}"),
    Column("mean minutes", lambda g: g.mean_minutes, "{:.2f}", terminal=False),
    Column(
        "minutes range",
        lambda g: (g.min_minutes, g.max_minutes) if g.min_minutes is not None else None,
        "{0[0]:.2f}..{0[1]:.2f}",
    ),
    Column("samples to converge", lambda g: g.samples_to_converge, "{:,.0f}"),
    Column("samples/s", lambda g: g.throughput_samples_per_s, "{:,.1f}"),
    Column("samples/s/acc", lambda g: g.throughput_per_accelerator, "{:,.2f}"),
    Column("MFU", lambda g: g.mfu, "{:.1%}"),
    Column("GPU-hours per run", lambda g: g.gpu_hours, "{:,.2f}"),
    Column("USD per run", lambda g: g.cost_usd, "{:,.2f}"),
]

RUN_COLUMNS = [
    Column("run", lambda r: Path(r.file).name),
    Column("status", lambda r: r.status),
    Column("minutes", lambda r: r.minutes, "{:.2f}"),
    Column("scored", lambda r: "yes" if r.scored else "no"),
    Column("samples to converge", lambda r: r.samples_to_converge, "{:,}"),
    Column("final eval", lambda r: r.final_eval_loss, "{:.4f}"),
    Column("GBS", lambda r: r.global_batch_size, terminal=False),
    Column("LR", lambda r: r.learning_rate, "{:g}", terminal=False),
    Column("warmup", lambda r: r.warmup_steps, terminal=False),
    Column("evals", lambda r: r.evals),
    Column("eval minutes", lambda r: r.eval_minutes, "{:.2f}"),
    Column("samples/s", lambda r: r.throughput_samples_per_s, "{:,.1f}", terminal=False),
    Column("samples/s/acc", lambda r: r.throughput_per_accelerator, "{:,.2f}"),
    Column("compliance", lambda r: r.compliance),
]


def to_document(groups: list[GroupResult], comparison: dict[str, Any] | None = None) -> dict[str, Any]:
    document: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "groups": [g.to_json() for g in groups]}
    if comparison is not None:
        document["comparison"] = comparison
    return document


def render_json(groups: list[GroupResult], comparison: dict[str, Any] | None = None) -> str:
    return json.dumps(_finite(to_document(groups, comparison)), indent=2, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    """NaN and infinities (a diverged run's loss, say) become null: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


CSV_FIELDS = [
    "path", "benchmark", "system", "submitter", "accelerator_model", "accelerators", "ruleset",
    "olympic_minutes", "mean_minutes", "min_minutes", "max_minutes", "run_count", "scored_runs",
    "samples_to_converge", "gpu_hours", "price_per_gpu_hour", "cost_usd", "throughput_samples_per_s",
    "throughput_per_accelerator", "mfu",
]  # fmt: skip


def render_csv(groups: list[GroupResult]) -> str:
    """One row per group, the JSON names as headers (full precision, for spreadsheets and scripts)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for group in groups:
        writer.writerow({name: _csv_cell(getattr(group, name)) for name in CSV_FIELDS})
    return out.getvalue()


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: Any) -> Any:
    """A text cell a spreadsheet would run as a formula gets a leading quote (OWASP CSV injection)."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


# Markdown renders inline HTML, links and emphasis; these characters become entities so a cell or line
# shows as text and a pipe cannot split a table cell. Control characters are spelled out (printable).
_MD_ENTITIES = str.maketrans({c: f"&#{ord(c)};" for c in "\\`|[]*"})


def _md(text: Any) -> str:
    return html.escape(printable(str(text))).translate(_MD_ENTITIES)


def _md_table(columns: list[Column], rows: list[Any]) -> list[str]:
    lines = ["| " + " | ".join(c.header for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_md(c.text(row)) for c in columns) + " |")
    return lines


def render_markdown(groups: list[GroupResult], comparison: dict[str, Any] | None = None) -> str:
    lines = ["# flux-cluster report", "", *_md_table(GROUP_COLUMNS, groups)]
    for group in groups:
        lines += ["", f"## {_md(_name(group))} ({_md(group.benchmark)})", "", f"path: {_md(group.path)}", ""]
        lines += _md_table(RUN_COLUMNS, group.runs)
        lines += [f"- warning: {_md(w)}" for w in all_warnings(group)]
    if comparison is not None:
        lines += ["", *comparison_markdown(comparison)]
    return "\n".join(lines) + "\n"


def all_warnings(group: GroupResult) -> list[str]:
    """The group's warnings, then each run's, prefixed with the run's file name."""
    out = list(group.warnings)
    for run in group.runs:
        out += [f"{Path(run.file).name}: {w}" for w in run.warnings]
        if run.compliance == "failed":
            first = run.compliance_messages[0] if run.compliance_messages else "see the checker"
            out.append(f"{Path(run.file).name}: compliance failed: {first}")
    return out


def _batch_line(group: GroupResult) -> str:
    settings = sorted({(r.global_batch_size, r.learning_rate, r.warmup_steps) for r in group.runs}, key=str)
    return "; ".join(
        f"GBS {b or '-'}, LR {lr if lr is not None else '-'}, warmup {w if w is not None else '-'}"
        for b, lr, w in settings
    )


def print_tables(groups: list[GroupResult], console: Any, checked: bool) -> None:
    from rich.table import Table
    from rich.text import Text

    group_columns = [c for c in GROUP_COLUMNS if c.terminal]
    run_columns = [c for c in RUN_COLUMNS if c.terminal]
    rules = "as MLPerf's result_summarizer" if checked else "summarizer rules; compliance not checked"
    summary = Table(title=f"flux-cluster report (olympic scores {rules})", title_justify="left")
    for column in group_columns:
        summary.add_column(column.header, justify="left" if column.header == "system" else "right")
    for group in groups:
        summary.add_row(*(plain(c.text(group)) for c in group_columns))
    for group in groups:
        title = f"{_name(group)} ({group.benchmark or '?'}): {group.path}"
        runs = Table(title=Text.assemble(plain(title), "\n", _batch_line(group)), title_justify="left")
        for column in run_columns:
            runs.add_column(column.header, justify="left" if column.header in ("run", "status") else "right")
        for run in group.runs:
            runs.add_row(*(plain(c.text(run)) for c in run_columns), style=None if run.scored else "dim")
        console.print(runs)
        for warning in all_warnings(group):
            console.print(Text.assemble(("warning:", "yellow"), " ", plain(warning)), soft_wrap=True)
    console.print(summary)


def comparison_markdown(comparison: dict[str, Any]) -> list[str]:
    lines = [f"# Comparison: A = {_md(comparison['a'])}, B = {_md(comparison['b'])}"]
    for pair in comparison["pairs"]:
        lines += [
            "",
            f"## {_md(pair['a_name'])} vs {_md(pair['b_name'])}",
            "",
            "| metric | A | B | B/A |",
            "|---|---|---|---|",
        ]
        for m in pair["metrics"]:
            cells = (m["name"], format_number(m["a"]), format_number(m["b"]), format_ratio(m["ratio"]))
            lines.append("| " + " | ".join(cells) + " |")
    lines += [f"- unmatched: {_md(u)}" for u in comparison["unmatched"]]
    return lines


def format_number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1000:
        return f"{value:,.0f}"
    if isinstance(value, float):
        return f"{value:,.4f}" if abs(value) < 1 else f"{value:,.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def format_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def print_comparison(comparison: dict[str, Any], console: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    for pair in comparison["pairs"]:
        a, b = (plain(f"{pair[f'{x}_name']} {pair[f'{x}_path']}") for x in "ab")
        table = Table(title=Text.assemble("A: ", a, "\nB: ", b), title_justify="left")
        for header in ("metric", "A", "B", "B/A"):
            table.add_column(header, justify="left" if header == "metric" else "right")
        for metric in pair["metrics"]:
            table.add_row(
                metric["name"],
                format_number(metric["a"]),
                format_number(metric["b"]),
                format_ratio(metric["ratio"]),
            )
        console.print(table)
    for unmatched in comparison["unmatched"]:
        console.print(Text.assemble(("unmatched:", "yellow"), " ", plain(unmatched)))
