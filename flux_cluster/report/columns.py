"""A column of the report's tables (one list of columns serves every format), how a terminal shows a
table of them (a compact default or --wide, fitted to the window, numbers never cut), and the comparison
tables' figures."""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flux_cluster.console import print_table
from flux_cluster.safe_text import plain


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[Any], Any]
    fmt: str = "{}"
    terminal: bool = True
    """In the terminal table's compact default (the columns that answer its question; report --wide shows
    every column); every other format has every column."""
    wrap: bool = False
    """Long text (a path): the HTML page may break it over lines."""
    page: bool = True
    """Shown in the HTML page's tables too (which must fit 1,400 px; its cards say the rest)."""
    missing: Callable[[Any], str | None] | None = None
    """What an empty cell says instead of '-' (a throughput the run's summary says was not measured)."""

    def text(self, row: Any) -> str:
        value = self.value(row)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return (self.missing(row) if self.missing else None) or "-"
        return self.fmt.format(value)


WIDE_HINT = " (report --wide: every column)"


def terminal_columns(columns: list[Column], rows: list[Any], wide: bool) -> list[Column]:
    """The columns a terminal table shows: every one with --wide, else its compact default less the
    columns no row has a value in (the question's, where there is something to say)."""
    if wide:
        return list(columns)
    compact = [c for c in columns if c.terminal]
    return [c for i, c in enumerate(compact) if i == 0 or any(c.text(r) != "-" for r in rows)] or compact


def terminal_table(
    console: Any,
    title: Any,
    columns: list[Column],
    rows: list[Any],
    *,
    left: tuple[str, ...],
    priority: Sequence[str] = (),
    wide: bool = False,
    dim: Callable[[Any], bool] | None = None,
) -> None:
    """One table on the terminal (or redirected): terminal_columns of it, text columns (``left``) to the
    left, numbers never cut (console.print_table fits the window, dropping the columns last in
    ``priority``; --wide prints every column whole however wide); rows ``dim`` says are greyed."""
    from rich.table import Table

    shown = terminal_columns(columns, rows, wide)
    out = Table(title=title, title_justify="left")
    for column in shown:
        out.add_column(column.header, justify="left" if column.header in left else "right")
    for row in rows:
        out.add_row(*(plain(c.text(row)) for c in shown), style="dim" if dim and dim(row) else None)
    print_table(console, out, priority, fit=not wide, hint=WIDE_HINT)


def format_number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1000:
        return f"{value:,.0f}"
    if isinstance(value, float):
        return f"{value:,.4f}" if abs(value) < 1 else f"{value:,.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


PERCENT_METRICS = frozenset({"MFU"})
"""Comparison metrics that are fractions, shown as percents as every other output shows them."""


def format_metric(metric: dict[str, Any], side: str) -> str:
    """A comparison metric's value on one side ('a' or 'b'), as the tables show that figure."""
    value = metric[side]
    if metric["name"] in PERCENT_METRICS and isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.1%}"
    return format_number(value)


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
                format_metric(metric, "a"),
                format_metric(metric, "b"),
                format_ratio(metric["ratio"]),
            )
        print_table(console, table)
    for unmatched in comparison["unmatched"]:
        console.print(Text.assemble(("unmatched:", "yellow"), " ", plain(unmatched)), soft_wrap=True)
