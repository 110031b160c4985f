"""flux-cluster image: build the container image a system's jobs run in."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flux_cluster.cli.console import Typer
from flux_cluster.cli.options import SetOption

if TYPE_CHECKING:
    from flux_cluster.image.build import BuildRequest

app = Typer(help="Build the container images that cluster jobs run in.", no_args_is_help=True)


VendorOption = Annotated[
    str | None, typer.Option("--vendor", help="nvidia (NGC PyTorch base) or amd (ROCm PyTorch base).")
]

ImageSystemOption = Annotated[
    str | None,
    typer.Option(
        "--system",
        "-s",
        help="Build what this system runs: its vendor and runtime; a .sqsh image path becomes --sqsh, "
        "another image name an extra --tag.",
    ),
]

TagOption = Annotated[
    list[str] | None, typer.Option("--tag", help="Also tag the image with this name (repeatable).")
]

PushOption = Annotated[
    str | None,
    typer.Option(
        "--push", metavar="REGISTRY", help="Push every tag to REGISTRY, e.g. registry.example.com/mlperf."
    ),
]

SqshOption = Annotated[
    Path | None,
    typer.Option(
        "--sqsh",
        help="Also convert the image with 'enroot import' for Pyxis: a .sqsh file, or a folder that "
        "gets flux-cluster+<version>-<vendor>.sqsh.",
    ),
]

BuilderOption = Annotated[
    str | None,
    typer.Option(
        "--builder",
        help="docker or podman \\[default: the system's runtime, else docker if installed, else podman].",
        show_default=False,
    ),
]

BaseImageOption = Annotated[
    str | None,
    typer.Option(
        "--base-image",
        help="Build on another base than the Dockerfile's pinned one (a site mirror, a newer release).",
    ),
]

PlatformOption = Annotated[
    str | None, typer.Option("--platform", help="Target platform, e.g. linux/arm64 for Grace (GB200).")
]

ContextOption = Annotated[
    Path | None,
    typer.Option(
        "--context",
        help="flux-cluster source checkout to build \\[default: this installation's "
        "checkout, else the current folder].",
        show_default=False,
    ),
]

AllowDirtyOption = Annotated[
    bool,
    typer.Option(
        "--allow-dirty",
        help="Build even if tracked files differ from the git commit "
        "(the revision label then ends in -dirty).",
    ),
]

DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Print the commands and run nothing.")]


@app.command("build")
def build(
    vendor: VendorOption = None,
    system: ImageSystemOption = None,
    overrides: SetOption = None,
    tags: TagOption = None,
    push: PushOption = None,
    sqsh: SqshOption = None,
    builder: BuilderOption = None,
    base_image: BaseImageOption = None,
    platform: PlatformOption = None,
    context: ContextOption = None,
    allow_dirty: AllowDirtyOption = False,
    dry_run: DryRunOption = False,
) -> None:
    """Build the image (docker or podman), tag it with version and git revision, push it, make a .sqsh."""
    import shutil

    from flux_cluster.image import build as image_build
    from flux_cluster.image.request import build_request

    request = build_request(
        vendor=vendor,
        system=system,
        overrides=overrides or [],
        tags=tags or [],
        push=push,
        sqsh=sqsh,
        builder=builder,
        base_image=base_image,
        platform=platform,
        context=context,
        allow_dirty=allow_dirty,
        dry_run=dry_run,
        warn=lambda line: typer.echo(line, err=True),
    )
    steps = image_build.plan_build(request)
    if dry_run:
        for step in steps:
            typer.echo(step.shell())
        missing = [t for t in image_build.required_tools(steps) if not shutil.which(t)]
        if missing:
            typer.echo(f"note: not installed here: {', '.join(missing)}", err=True)
        return
    image_build.check_tools(steps)
    image_build.run_plan(steps, lambda line: typer.secho(line, bold=True, err=True))
    _print_usage(request)


def _print_usage(request: "BuildRequest") -> None:
    from flux_cluster.config.image_names import pyxis_reference, sqsh_name
    from flux_cluster.image.build import local_tags, pushed_name

    lines = [f"built {', '.join(local_tags(request))}"]
    if request.push:
        lines.append(f"pushed to {request.push}; systems use it with --set container.registry={request.push}")
        lines.append(
            f"  (pyxis pulls {pyxis_reference(request.push, request.vendor, request.version)}, "
            f"docker/podman {pushed_name(request.push, local_tags(request)[0])})"
        )
    if request.sqsh:
        use = f"container.image={request.sqsh}"
        if request.sqsh.name == sqsh_name(request.vendor, request.version):
            use = f"container.image_dir={request.sqsh.parent}"
        lines.append(f"wrote {request.sqsh}; pyxis systems use it with --set {use}")
    for line in lines:
        typer.echo(line)
