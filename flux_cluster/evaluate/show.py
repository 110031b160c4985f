"""An evaluation's result on the terminal (flux-cluster evaluate) or in its job's log: the table, then
what was written. Importing this module stays cheap (no torch)."""

from typing import TYPE_CHECKING, Any

from flux_cluster.console import cli_console, print_table
from flux_cluster.evaluate import base_label
from flux_cluster.safe_text import markup_escape, printable

if TYPE_CHECKING:
    from rich.table import Table

    from flux_cluster.evaluate.run import EvalResult


def show_result(result: "EvalResult") -> None:
    """The table on stdout; whether the figures mean anything and the files written on stderr."""
    console = cli_console(stderr=True)
    print_table(cli_console(), results_table(result.document))
    if not result.document["meaningful"]:
        console.print(
            f"not meaningful: {result.document['meaningful_reason']}", highlight=False, soft_wrap=True
        )
    wrote = printable(f"wrote {result.json_path} and {result.grid_path}")
    console.print(wrote, markup=False, highlight=False, soft_wrap=True)


def results_table(document: dict[str, Any]) -> "Table":
    """Base vs tuned: latency percentiles, images/s, peak memory, CLIP score, validation loss."""
    from rich.table import Table

    latency, clip, val = document["latency"], document["clip_score"], document["val_loss"] or {}
    columns = ["base"] + (["tuned"] if latency["tuned"] else [])
    title = f"evaluate {document['target']} on {document['device']}"
    if not document["meaningful"]:
        title += " (figures not meaningful)"
    table = Table(title=markup_escape(title))  # TARGET's name: control characters spelled out
    table.add_column("")
    for column in columns:
        shown = base_label(document.get("base_precision")) if column == "base" else column
        table.add_column(shown, justify="right")

    def number(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    rows = [
        (f"{name} (s)", lambda c, key=key: number(latency[c][key], 3))
        for name, key in (("p50", "p50_s"), ("p90", "p90_s"), ("p99", "p99_s"), ("mean", "mean_s"))
    ]
    rows += [
        ("images/s", lambda c: number(latency[c]["images_per_s"], 2)),
        ("peak GB", lambda c: number(latency[c]["peak_memory_gb"], 2)),
        ("CLIP score", lambda c: number(clip[c], 2)),
        ("val loss", lambda c: number(val.get(c), 4)),
    ]
    for name, cell in rows:
        table.add_row(name, *(cell(c) for c in columns))
    return table
