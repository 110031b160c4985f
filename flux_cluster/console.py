"""How flux-cluster prints, from the CLI and the library alike: rich output with emoji codes off, lines whole
when redirected, and tables that never cut a value (every module that builds a rich Table prints it with
print_table; a test checks it). rich is imported only when something is printed."""

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from flux_cluster.safe_text import NUMBER

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Column, Table

WHOLE_WORD = 12
"""A word up to this long (a number, a status, a short name) never breaks in a terminal table; a longer one
(a path) may fold over lines. A number never breaks, however long."""
_NUMBER = re.compile(rf"{NUMBER}[%x*]?")


def cli_console(stderr: bool = False) -> "Console":
    """A rich Console that prints ':1234:' (e.g. in 'afterany:1234:1235') as typed, not as an emoji, and,
    redirected (a log, a pipe), each line whole: a long path is never wrapped mid-token at 80 columns."""
    from rich.console import Console

    console = Console(stderr=stderr, emoji=False)
    console.soft_wrap = not console.is_terminal
    return console


def print_table(
    out: "Console", table: "Table", priority: Sequence[str] = (), fit: bool = True, hint: str = ""
) -> None:
    """Every table flux-cluster prints goes through here. Its title is a line of its own, never wrapped
    to the table's width (a long path stays whole). On a terminal the table fits the window without
    cutting a value: headers wrap at spaces, long text folds, numbers stay whole, and where even that is
    too wide the columns least important go (those not in ``priority``, the most important first, from
    the right; then priority's last), named in one line after the table (with ``hint``). Piped (| grep,
    > file) or with fit False (report --wide), every value is whole on one line, however wide."""
    from rich.text import Text

    title, table.title = table.title, None
    columns = list(table.columns)
    settings = [(c.width, c.no_wrap, c.overflow) for c in columns]
    try:
        if title is not None:
            heading = title if isinstance(title, Text) else out.render_str(str(title))  # markup, as rich
            out.print(heading, style="table.title", soft_wrap=True, highlight=False)
        if out.is_terminal and fit:
            dropped = _fit_to_width(out, table, priority)
            out.print(table)
            if dropped:
                out.print(
                    f"not shown at {out.width} columns: {', '.join(dropped)}{hint}",
                    style="dim",
                    soft_wrap=True,
                    highlight=False,
                    markup=False,
                )
            return
        _print_whole(out, table)
    finally:  # the table as it came: it may be printed again (to another console, at another width)
        table.title = title
        table.columns[:] = columns
        for index, (column, (width, no_wrap, overflow)) in enumerate(zip(columns, settings, strict=True)):
            column._index = index
            column.width, column.no_wrap, column.overflow = width, no_wrap, overflow


def _print_whole(out: "Console", table: "Table") -> None:
    from rich.measure import Measurement

    for column in table.columns:
        column.no_wrap = True  # at its measured width nothing is cut; no value breaks over lines
    needed = Measurement.get(out, out.options.update_width(1 << 20), table).maximum
    saved = out.width
    out.width = max(saved, needed)  # print() never renders wider than the console
    try:
        out.print(table, crop=False)
    finally:
        out.width = saved


def _texts(out: "Console", table: "Table", column: "Column") -> list[str]:
    from rich.text import Text

    cells = [column.header] if table.show_header else []
    cells += list(column.cells)
    return [
        c.plain if isinstance(c, Text) else out.render_str(c).plain if isinstance(c, str) else ""
        for c in cells
    ]


def _widths(out: "Console", table: "Table", column: "Column") -> tuple[int, int]:
    """(least width that cuts no number and breaks no short word, width that breaks nothing)."""
    from rich.cells import cell_len

    least, natural = 1, 1
    for text in _texts(out, table, column):
        for line in text.splitlines() or [""]:
            natural = max(natural, cell_len(line))
            for word in line.split():
                whole = cell_len(word) <= WHOLE_WORD or _NUMBER.fullmatch(word)
                least = max(least, cell_len(word) if whole else WHOLE_WORD)
    return least, natural


def _overhead(table: "Table", count: int) -> int:
    """Borders and padding of a table of count columns."""
    from rich.padding import Padding

    _, right, _, left = Padding.unpack(table.padding)
    edges = 2 if table.box and table.show_edge else 0
    separators = count - 1 if table.box else 0
    padding = (left + right) * count - (0 if table.pad_edge else left + right)
    return edges + separators + padding


def _fit_to_width(out: "Console", table: "Table", priority: Sequence[str]) -> list[str]:
    """Fixed widths for table's columns that fit out's width; the headers of the columns left out.
    Columns are told apart by their place (two may hold the same header and cells)."""
    columns = list(table.columns)
    places = range(len(columns))
    headers = [_texts(out, table, c)[0] if table.show_header else str(i) for i, c in enumerate(columns)]
    ranges = [_widths(out, table, c) for c in columns]
    rank: dict[str, int] = {}
    for n, header in enumerate(priority):
        rank.setdefault(header, n)
    # least important first: unranked columns from the right, then the ranked ones from the last
    order = [i for i in reversed(places) if headers[i] not in rank]
    order += sorted((i for i in places if headers[i] in rank), key=lambda i: (rank[headers[i]], i))[::-1]
    kept = list(places)
    while len(kept) > 1 and sum(ranges[i][0] for i in kept) + _overhead(table, len(kept)) > out.width:
        kept.remove(order.pop(0))
    widths = {i: ranges[i][0] for i in kept}
    spare = out.width - _overhead(table, len(kept)) - sum(widths.values())
    growing = [i for i in kept if widths[i] < ranges[i][1]]
    while spare > 0 and growing:  # a character each in turn: headers unwrap, long text unfolds
        for i in list(growing):
            if spare == 0:
                break
            widths[i] += 1
            spare -= 1
            if widths[i] >= ranges[i][1]:
                growing.remove(i)
    table.columns[:] = [columns[i] for i in kept]
    for place, i in enumerate(kept):
        column = columns[i]
        column._index = place  # rich pads a column by its place (print_table restores both)
        column.width = widths[i]
        column.no_wrap, column.overflow = False, "fold"  # at least each number's width: only text folds
    return [headers[i] for i in places if i not in kept]
