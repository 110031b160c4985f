"""Text from files we do not control (result logs, folder names, site configs), made safe to show.

A terminal obeys the control characters in what it prints (ESC starts sequences that clear the screen,
retitle the window or plant OSC-8 links; a lone CR overwrites the line) and bidi controls reorder what
the reader sees. Here each becomes a visible escape such as ``\\x1b``. Rich markup and emoji codes are
never interpreted in the ``Text`` these helpers return.
"""

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from rich.text import Text

CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""Every character printable spells out."""


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """text with every control character (C0, DEL, C1, line separators, bidi controls) spelled out."""
    return CONTROL.sub(_visible, text)


def plain(text: str, style: str = "") -> "Text":
    """A rich Text showing text exactly (no markup, no emoji codes), control characters spelled out."""
    from rich.text import Text

    return Text(printable(text), style=style)


def markup_escape(text: str) -> str:
    """text for a rich markup string (a progress bar's description, say)."""
    from rich.markup import escape

    return escape(printable(text))


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
NUMBER = r"[-+]?(?:\d+(?:[,_]\d+)*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
"""One number as flux-cluster writes one: a sign, digits (',' or '_' between groups), decimals, an
exponent ('-1,234.5', '3e-05'). A CSV cell that is one stays a number; a terminal table never breaks one
(console.py, which also allows a unit: '12%', '1.16x')."""
_NUMBER = re.compile(NUMBER)


def csv_cell(value: object) -> object:
    """A CSV cell: text gets its control characters spelled out (a CSV is read on terminals too), and a
    leading quote where a spreadsheet would run it as a formula (OWASP CSV injection); numbers, and text
    that is one plain number ('-1.5'), unchanged."""
    if not isinstance(value, str):
        return value
    if value.startswith(_FORMULA_START) and not _NUMBER.fullmatch(value):
        return "'" + printable(value)
    return printable(value)


def csv_text(
    rows: "Iterable[Mapping[str, object]]",
    columns: "Sequence[str] | None" = None,
    *,
    float_format: str | None = None,
) -> str:
    """The one way flux-cluster writes CSV: a header of columns (default: the first row's keys), then a
    line per row, every cell (and header) through csv_cell; None and a missing key as an empty cell, floats
    in float_format where given (e.g. '{:.6g}')."""
    import csv
    import io

    rows = list(rows)
    names = list(columns if columns is not None else (rows[0] if rows else {}))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([csv_cell(name) for name in names])
    for row in rows:
        writer.writerow([_csv_value(row.get(name), float_format) for name in names])
    return out.getvalue()


def _csv_value(value: object, float_format: str | None) -> object:
    if value is None:
        return ""
    if isinstance(value, float) and float_format is not None:
        return float_format.format(value)
    return csv_cell(value)
