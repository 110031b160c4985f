"""How flux-cluster prints, from the CLI and the library alike: rich output with emoji codes off, tables
at full width when piped. rich is imported only when something is printed."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def cli_console(stderr: bool = False) -> "Console":
    """A rich Console that prints ':1234:' (e.g. in 'afterany:1234:1235') as typed, not as an emoji."""
    from rich.console import Console

    return Console(stderr=stderr, emoji=False)


def print_table(out: "Console", table: "Table") -> None:
    """On a terminal, the table fits the window; piped (| grep, > file) it keeps every value whole,
    however wide, instead of being cut or wrapped at 80 columns."""
    if out.is_terminal:
        out.print(table)
        return
    from rich.measure import Measurement

    needed = Measurement.get(out, out.options.update_width(1 << 20), table).maximum
    saved = out.width
    out.width = max(saved, needed)  # print() never renders wider than the console
    try:
        out.print(table, crop=False)
    finally:
        out.width = saved
