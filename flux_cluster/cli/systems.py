"""flux-cluster systems: list the shipped and site system configs, show one fully resolved."""

import json
from typing import TYPE_CHECKING, Annotated

import typer

from flux_cluster.cli.console import Typer, cli_console, print_table
from flux_cluster.cli.options import SetOption
from flux_cluster.errors import FluxClusterError

if TYPE_CHECKING:
    from rich.console import Console

    from flux_cluster.config import SystemConfig

app = Typer(help="List and inspect system configs.", no_args_is_help=True)


@app.command("list")
def list_systems() -> None:
    """Show every known system as a table."""
    from rich.table import Table

    from flux_cluster.config import known_systems, load_system
    from flux_cluster.safe_text import plain

    console = cli_console()
    wide = console.width >= 120 or not console.is_terminal  # the description column where it fits, or piped
    table = Table(title="flux-cluster systems")
    columns = ["system", "nodes x GPUs", "accelerator", "runtime", "bf16 TFLOP/s", "$/GPU-h"]
    for column in columns:
        table.add_column(
            column, justify="right" if column in ("bf16 TFLOP/s", "$/GPU-h") else "left", no_wrap=True
        )
    if wide:
        table.add_column("description", overflow="fold")
    problems: list[str] = []
    for name in known_systems():
        try:
            c = load_system(name).config
        except FluxClusterError as exc:
            problems.append(f"{name}: {exc}")
            table.add_row(plain(name), "-", plain("invalid", "red"), "-", "-", "-", *(["-"] if wide else []))
            continue
        runtime = "local" if c.launcher == "local" else c.container.runtime
        cells = [
            name,
            f"{c.nodes} x {c.gpus_per_node}",
            c.gpu_model,
            runtime,
            f"{c.peak_bf16_tflops:g}",
            f"{c.price_per_gpu_hour:.2f}",
        ]
        # config text is shown as text: no rich markup, no terminal control sequences
        table.add_row(*map(plain, cells), *([plain(c.description)] if wide else []))
    print_table(console, table)
    for problem in problems:
        console.print(plain("invalid system", "red"), plain(problem))


@app.command("show")
def show_system(
    name: Annotated[str, typer.Argument(help="System name or YAML path.")],
    overrides: SetOption = None,
    output_format: Annotated[str, typer.Option("--format", help="table, yaml or json.")] = "table",
) -> None:
    """Show the fully resolved config of a system and where each value came from."""
    from flux_cluster.config import load_system
    from flux_cluster.config.loader import flat_view

    resolved = load_system(name, overrides or [])
    rows = flat_view(resolved)
    if output_format == "json":
        typer.echo(json.dumps({k: {"value": v, "source": s} for k, v, s in rows}, indent=2))
        return
    if output_format == "yaml":
        import yaml

        typer.echo(yaml.safe_dump(resolved.config.model_dump(mode="json"), sort_keys=False), nl=False)
        return
    if output_format != "table":
        raise FluxClusterError(f"--format {output_format!r}: expected table, yaml or json")
    from rich.table import Table

    from flux_cluster.safe_text import plain

    table = Table(title=plain(f"system {resolved.config.name} (from {resolved.file})"))
    table.add_column("key")
    table.add_column("value")
    table.add_column("source")
    for key, value, source in rows:
        style = "dim" if source == "default" else ""
        table.add_row(plain(key), plain(json.dumps(value)), plain(source), style=style)
    console = cli_console()
    print_table(console, table)
    if resolved.config.train.precision == "fp8":
        from flux_cluster.config.training import FP8_STATUS

        console.print(FP8_STATUS, markup=False, highlight=False, soft_wrap=True)
    if resolved.config.train.micro_batch_size == "auto":  # what submit would pick
        from flux_cluster.training.batch_choice import resolve_micro_batch  # torch loads here

        try:
            choice = resolve_micro_batch(resolved.config)[1]
            line = choice.describe() if choice else ""
        except FluxClusterError as exc:
            line = str(exc)
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    _print_image_status(console, resolved.config, name)


def _print_image_status(out: "Console", config: "SystemConfig", name: str) -> None:
    from flux_cluster.image.status import image_status
    from flux_cluster.safe_text import markup_escape as escape

    status = image_status(config.container)
    if status is None:
        return
    label = {
        True: "[green]image present[/green]",
        False: "[red]image missing[/red]",
        None: "[yellow]image[/yellow]",
    }
    out.print(f"{label[status.present]}: {escape(status.detail)}", highlight=False)
    if status.present is False:
        out.print(f"  build it: flux-cluster image build --system {escape(name)}", highlight=False)
