"""Options shared by several commands, declared once."""

from pathlib import Path
from typing import Annotated

import typer

SystemOption = Annotated[
    str,
    typer.Option(
        "--system", "-s", help="System config name (see 'flux-cluster systems list') or a YAML path."
    ),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Override a config value, e.g. --set nodes=4 --set env.NCCL_DEBUG=INFO (repeatable)."
    ),
]
RunsDirOption = Annotated[
    Path | None,
    typer.Option(
        "--runs-dir",
        help="Parent of run directories \\[default: $FLUX_CLUSTER_RUNS, else (submit, preflight) the "
        "system's paths.log_root, else ./runs].",
        show_default=False,
    ),
]
RunArgument = Annotated[
    str | None,
    typer.Argument(help="Run directory, '<experiment>/<name>' or a unique suffix; default: the latest."),
]
