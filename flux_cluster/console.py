"""How flux-cluster prints, from the CLI and the library alike: rich output with emoji codes off, tables
at full width when piped (every module that builds a rich Table prints it with print_table; a test checks
it). rich is imported only when something is printed."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def cli_console(stderr: bool = False) -> "Console":
    """A rich Console that prints ':1234:' (e.g. in 'afterany:1234:1235') as typed, not as an emoji."""
    from rich.console import Console

    return Console(stderr=stderr, emoji=False)


def print_table(out: "Console", table: "Table") -> None:
    """Every table flux-cluster prints goes through here. Its title is a line of its own, never wrapped
    to the table's width (a long path stays whole). On a terminal the table fits the window; piped
    (| grep, > file) it keeps every value whole on one line, however wide: never cut, never wrapped."""
    from rich.measure import Measurement
    from rich.text import Text

    title, table.title = table.title, None
    try:
        if title is not None:
            heading = title if isinstance(title, Text) else out.render_str(str(title))  # markup, as rich
            out.print(heading, style="table.title", soft_wrap=True, highlight=False)
        if out.is_terminal:
            out.print(table)
            return
        for column in table.columns:
            column.no_wrap = True  # at its measured width nothing is cut; no value breaks over lines
        needed = Measurement.get(out, out.options.update_width(1 << 20), table).maximum
        saved = out.width
        out.width = max(saved, needed)  # print() never renders wider than the console
        try:
            out.print(table, crop=False)
        finally:
            out.width = saved
    finally:
        table.title = title
