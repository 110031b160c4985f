"""flux_cluster.console: redirected lines stay whole; a terminal table fits its window and cuts no value."""

import io

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from flux_cluster.console import cli_console, print_table


def test_redirected_lines_are_never_wrapped_mid_token(capsys: pytest.CaptureFixture[str]) -> None:
    path = "/lustre/" + "a-long-folder-name/" * 12 + "runs/finetune/20261129-020335-local"
    cli_console(stderr=True).print(f"[bold]run[/bold] {path} (train on local, 2 local processes)")
    assert capsys.readouterr().err == f"run {path} (train on local, 2 local processes)\n"


def _table(rows: int = 3) -> Table:
    table = Table(title="t")
    for header in ("name", "a long header", "samples to converge", "path", "status"):
        table.add_column(header)
    for i in range(rows):
        table.add_row(f"run-{i}", f"{1.5 + i:.4f}", f"{11_300_000 + i:,}", "/x" * 40, "not checked")
    return table


DROPPED = {30: "a long header, path, status", 40: "path, status", 60: None, 80: None, 120: None}
"""What a window of each width leaves out: the path folds from 60 on; below, the unranked columns go first
(from the right), then the ranked ones from the last."""


@pytest.mark.parametrize("width", DROPPED)
def test_a_terminal_table_fits_and_keeps_numbers_whole_dropping_the_least_important(width: int) -> None:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None)
    print_table(console, _table(), priority=("name", "samples to converge", "a long header"), hint=" (more)")
    text = out.getvalue()
    lines = text.splitlines()
    table = [line for line in lines if line[:1] in "┏┃┡│└"]  # the note after it is one line, however long
    assert "\u2026" not in text and all(cell_len(line) <= width for line in table), text
    assert all(f"{11_300_000 + i:,}" in text and f"run-{i}" in text for i in range(3)), text
    note = [line for line in lines if line.startswith("not shown at")]
    dropped = DROPPED[width]
    assert note == ([f"not shown at {width} columns: {dropped} (more)"] if dropped else []), text
    assert ("/x/x" in text) == (dropped is None)


def test_a_redirected_table_keeps_every_value_whole_and_fit_false_too() -> None:
    for console in (
        Console(file=io.StringIO(), width=60),
        Console(file=io.StringIO(), width=60, force_terminal=True),
    ):
        print_table(console, _table(1), fit=False)
        text = console.file.getvalue()
        assert "/x" * 40 in text and "samples to converge" in text and "\u2026" not in text
        assert console.width == 60  # restored


def test_a_printed_table_is_left_as_it_came_so_it_prints_again_the_same() -> None:
    """print_table fixes widths and wrapping to fit one window; the table keeps its own (a second print,
    to a file, is whole again)."""
    table = _table(1)
    table.columns[0].width, table.columns[1].no_wrap, table.columns[3].overflow = 7, True, "ellipsis"
    before = [(c.width, c.no_wrap, c.overflow) for c in table.columns]
    for console in (
        Console(file=io.StringIO(), width=40, force_terminal=True),  # fitted: two columns dropped
        Console(file=io.StringIO(), width=40),  # redirected: every column whole
    ):
        print_table(console, table, priority=("name",))
        assert [(c.width, c.no_wrap, c.overflow) for c in table.columns] == before
    assert "/x" * 40 in console.file.getvalue()


def test_two_columns_alike_are_told_apart_by_their_place() -> None:
    """Equal headers and cells (rich's Column compares as a dataclass): the one left out is named."""
    out = io.StringIO()
    table = Table()
    for header in ("name", "same", "same"):
        table.add_column(header)
    table.add_row("a-run", "x" * 14, "x" * 14)
    print_table(Console(file=out, width=30, force_terminal=True, color_system=None), table)
    assert "not shown at 30 columns: same" in out.getvalue()


def test_the_terminal_and_the_csv_read_numbers_alike() -> None:
    """One number pattern (safe_text.NUMBER): grouped digits and a capital exponent are a number to both,
    never folded in a table, never quoted in a CSV; an expression is neither."""
    from flux_cluster.safe_text import csv_cell

    number, expression = "-1,234,567.5E+05", "-1,234+5"
    assert csv_cell(number) == number and csv_cell(expression) == "'" + expression
    out = io.StringIO()
    table = Table()
    for header in ("name", "value"):
        table.add_column(header)
    table.add_row("a-run-name-that-folds", number)
    print_table(Console(file=out, width=36, force_terminal=True, color_system=None), table)
    assert number in out.getvalue() and "a-run-name-that-folds" not in out.getvalue(), out.getvalue()
