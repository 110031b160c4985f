"""The flux-cluster command line. Start-up stays light: heavy imports (torch, submitit, pydantic
models) happen inside the commands that need them, never at import time."""

from typing import Annotated, Any

import typer

# Typer 0.29 (pinned) vendors click: its parsers raise these, not the click package's.
from typer._click import Context
from typer._click.exceptions import NoArgsIsHelpError, UsageError

from flux_cluster import __version__
from flux_cluster.cli import data, evaluate, forecast, image, launch, models, report, runs, sweep, systems
from flux_cluster.cli.console import Group, Typer
from flux_cluster.errors import FluxClusterError
from flux_cluster.safe_text import printable


def _usage_error_line(exc: UsageError) -> str:
    """Click's boxed usage error as one line: the command, the problem, where help is."""
    command = exc.ctx.command_path if exc.ctx else "flux-cluster"
    message = " ".join(exc.format_message().split())
    return f"error: {command}: {message} (see '{command} --help')"


class _CleanErrors(Group):
    """A FluxClusterError (or an OS error such as a full disk) becomes one line on stderr and exit code 2;
    so does a usage error (a bad option value, an unknown option), which Typer would draw as a box."""

    def make_context(self, *args: Any, **kwargs: Any) -> Context:
        try:
            return super().make_context(*args, **kwargs)
        except NoArgsIsHelpError:
            raise
        except UsageError as exc:
            typer.echo(_usage_error_line(exc), err=True)
            raise typer.Exit(2) from None

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except NoArgsIsHelpError:
            raise
        except UsageError as exc:
            typer.echo(_usage_error_line(exc), err=True)
            raise typer.Exit(2) from None
        except FluxClusterError as exc:  # names from files and folders: control characters spelled out
            typer.echo(f"error: {printable(str(exc))}", err=True)
            raise typer.Exit(2) from None
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            typer.echo(printable(f"error: {where}{exc.strerror or exc}"), err=True)
            raise typer.Exit(2) from None


app = Typer(
    cls=_CleanErrors,
    name="flux-cluster",
    help="Run the MLPerf Training flux1 benchmark and FLUX fine-tuning on GPU clusters.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"flux-cluster {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Run the MLPerf Training flux1 benchmark and FLUX fine-tuning on GPU clusters."""


app.add_typer(systems.app, name="systems")
app.add_typer(image.app, name="image")
app.add_typer(runs.app, name="runs")
app.add_typer(data.app, name="data")
app.add_typer(models.app, name="models")
app.command()(launch.submit)
app.command()(launch.preflight)
app.command()(sweep.sweep)
app.command(name="prepare-data")(data.prepare_data)
app.command()(runs.status)
app.command()(runs.logs)
app.command()(runs.cancel)
app.command()(report.report)
app.command()(forecast.forecast)
app.command()(evaluate.evaluate)


def main() -> None:
    app()
