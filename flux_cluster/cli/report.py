"""flux-cluster report: result logs -> time-to-train, throughput, GPU-hours, cost, scored as MLPerf does."""

import io
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flux_cluster.cli.options import RunsDirOption
from flux_cluster.errors import FluxClusterError
from flux_cluster.mlperf_rules import CHECK_TIMEOUT_S, QUALITY_TARGET, RULESETS

if TYPE_CHECKING:
    from rich.console import Console

    from flux_cluster.api import Report
    from flux_cluster.report.scoring import GroupResult
    from flux_cluster.report.sweep import SweepReport

NOTHING_FOUND_EXIT_CODE = 1


class Format(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"
    md = "md"
    html = "html"


RulesetChoice = StrEnum("RulesetChoice", {ruleset: ruleset for ruleset in RULESETS})
CompareOption = Annotated[
    tuple[Path, Path] | None,
    typer.Option(
        help="Compare two groups or two sets of groups: A B, with B/A ratios.",
        metavar="A B",
        show_default=False,
    ),
]
WideOption = Annotated[
    bool,
    typer.Option(
        "--wide",
        help="Terminal tables: every column, each value whole however wide \\[default: the columns that "
        "answer each table's question, fitted to the window; json, csv, md and html have every field].",
    ),
]


def report(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Run directories, MLPerf result folders (<org>/results/<system>/<benchmark>/) or log files, "
            "at any depth \\[default: the runs directory].",
            show_default=False,
        ),
    ] = None,
    output_format: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (atomically) instead of stdout.")
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check/--no-check",
            help="Run the official MLPerf compliance checker on every log; a failing run is not scored "
            "(as in the result_summarizer). --no-check scores every run whose run_stop says success.",
        ),
    ] = True,
    check_timeout: Annotated[
        float,
        typer.Option(
            min=0,
            metavar="SECONDS",
            help="Longest one log's compliance check may take; past it, that run fails, saying so.",
        ),
    ] = CHECK_TIMEOUT_S,
    ruleset: Annotated[
        RulesetChoice | None,
        typer.Option(
            help="Compliance ruleset for every log \\[default: the run config's; else the logs' (6.1.0 keys, "
            "6.x evaluation_frequency); else 'vX.Y' in the path; else 5.1.0, with a warning to give this].",
            show_default=False,
        ),
    ] = None,
    price: Annotated[
        list[str] | None,
        typer.Option(
            help="USD per accelerator-hour: SYSTEM=USD for one system (repeatable), or USD for every "
            "group; overrides \\[default: the run config's price_per_gpu_hour].",
            metavar="[SYSTEM=]USD",
            show_default=False,
        ),
    ] = None,
    peak_tflops: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="bf16 peak TFLOP/s per accelerator, for MFU \\[default: the run config's].",
            show_default=False,
        ),
    ] = None,
    target: Annotated[
        float, typer.Option(min=0, help="Quality target for logs without target_accuracy.")
    ] = QUALITY_TARGET,
    compare: CompareOption = None,
    wide: WideOption = False,
    runs_dir: RunsDirOption = None,
) -> None:
    """Harvest MLPerf result logs into olympic time-to-train, samples to converge, throughput, MFU,
    GPU-hours and cost per group (one directory of result files = one system x benchmark). Sweep folders
    (flux-cluster sweep) on their own: their points fastest first, the best per node count, and plots.

    Exit codes: 0 reported, 1 no result logs found, 2 bad input.
    """
    from flux_cluster.rundir import runs_root

    if output is not None and output.is_dir():
        raise FluxClusterError(f"--output {output}: is a directory; give a file name")
    every, prices = parse_prices(price or [])
    roots = list(paths or [])
    if not roots and compare is None:
        roots = [runs_root(runs_dir)]
        if not roots[0].exists():
            typer.echo(f"no runs directory {roots[0]}: give result folders or logs as arguments", err=True)
            raise typer.Exit(NOTHING_FOUND_EXIT_CODE)
    options = {
        "check": check,
        "check_timeout": check_timeout,
        "ruleset": ruleset.value if ruleset else None,
        "price": every,
        "prices": prices,
        "peak_tflops": peak_tflops,
        "target": target,
        "compare": compare,
    }
    found = _report(roots, options)
    if found.sweeps:
        _emit_sweeps(found.sweeps, output_format, output, wide)
        return
    _unpriced(prices, found.groups)
    _emit(found.groups, output_format, output, check, found.comparison, wide)


def parse_prices(values: list[str]) -> tuple[float | None, dict[str, float]]:
    """--price values: (USD for every group or None, {system: USD}); a bad one is one line."""
    import math

    every: float | None = None
    prices: dict[str, float] = {}
    for value in values:
        system, _, usd = value.rpartition("=")
        try:
            number = float(usd)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number < 0 or (system == "" and "=" in value):
            raise FluxClusterError(
                f"--price {value!r}: expected SYSTEM=USD or USD, USD a number >= 0 (e.g. aws_p5=6.88)"
            )
        if "=" in value:
            prices[system] = number
        elif every is not None:
            raise FluxClusterError(f"--price {value!r}: one price for every group was already given")
        else:
            every = number
    return every, prices


def _unpriced(prices: dict[str, float], groups: "list[GroupResult]") -> None:
    """Say which --price SYSTEM=USD matched no group (a typo would silently cost nothing)."""
    systems = {g.system for g in groups}
    for system in prices:
        if system not in systems:
            known = ", ".join(sorted(s for s in systems if s)) or "none"
            typer.echo(
                f"warning: --price {system}=...: no group of system {system!r} (systems: {known})", err=True
            )


def _report(roots: list[Path], options: dict[str, Any]) -> "Report":
    """api.report with a progress bar on a terminal; no result logs: their line, exit code 1."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flux_cluster import api
    from flux_cluster.safe_text import markup_escape

    console = Console(stderr=True)

    class _Bar:
        def __init__(self, progress: Progress) -> None:
            self.progress, self.task = progress, progress.add_task("finding logs", total=None)

        def start(self, total: int) -> None:  # once per harvest: --compare's A, then B
            self.progress.reset(self.task, total=total)

        def advance(self, description: str) -> None:
            # the description holds a file name, and rich reads descriptions as markup
            self.progress.update(self.task, advance=1, description=markup_escape(description))

    columns = (TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
            return api.report(roots, **options, progress=_Bar(progress))
    except api.NoResultsError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(NOTHING_FOUND_EXIT_CODE) from None


def _emit_sweeps(
    reports: "list[SweepReport]", output_format: Format, output: Path | None, wide: bool = False
) -> None:
    """Sweep folders (sweep.json): their points, the best per node count, the plots (HTML)."""
    from flux_cluster.report import sweep

    def draw(console: "Console") -> None:
        for report in reports:
            sweep.print_sweep(report, console, wide)

    renders = {
        Format.json: sweep.render_json,
        Format.csv: sweep.render_csv,
        Format.md: sweep.render_markdown,
        Format.html: sweep.render_html,
    }
    emit_as(output_format, output, draw, lambda: renders[output_format](reports))


def emit_as(
    output_format: Format, output: Path | None, draw: Callable[["Console"], None], render: Callable[[], str]
) -> None:
    """The table format drawn (print_tables_to), any other rendered and written (write_text)."""
    if output_format is Format.table:
        print_tables_to(draw, output)
    else:
        write_text(render(), output)


def _emit(
    groups: "list[GroupResult]",
    output_format: Format,
    output: Path | None,
    checked: bool,
    comparison: dict[str, Any] | None,
    wide: bool = False,
) -> None:
    from flux_cluster.report import formats

    if output_format is Format.table:

        def draw(console: "Console") -> None:
            formats.print_tables(groups, console, checked, wide)
            if comparison is not None:
                formats.print_comparison(comparison, console)

        print_tables_to(draw, output)
        return
    if output_format is Format.json:
        text = formats.render_json(groups, comparison)
    elif output_format is Format.csv:
        text = formats.render_csv(groups)
    elif output_format is Format.md:
        text = formats.render_markdown(groups, comparison)
    else:
        from flux_cluster.report.html import render_html

        text = render_html(groups, checked, comparison)
    write_text(text, output)


def print_tables_to(draw: Callable[["Console"], None], output: Path | None) -> None:
    """The table format: drawn on the terminal, or as text to a pipe or the --output file (no wrapping)."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=200) if output else Console()
    if not console.is_terminal:
        console = Console(file=buffer if output else sys.stdout, width=200)
    draw(console)
    if output is not None:
        write_text(buffer.getvalue(), output)


def write_text(text: str, output: Path | None) -> None:
    """To stdout, or atomically to the --output file."""
    # surrogateescape: a file name that is not UTF-8 comes out as its own bytes, not as an error
    data = text.encode("utf-8", "surrogateescape")
    if output is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    from flux_cluster.atomic import write_atomic

    write_atomic(output, data)
    typer.echo(f"wrote {output}", err=True)
