"""flux-cluster image: build the container image a system's jobs run in."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flux_cluster.cli.console import Typer
from flux_cluster.cli.options import SetOption
from flux_cluster.errors import FluxClusterError

if TYPE_CHECKING:
    from flux_cluster.image.build import BuildRequest

app = Typer(help="Build the container images that cluster jobs run in.", no_args_is_help=True)


@app.command("build")
def build(
    vendor: Annotated[
        str | None, typer.Option("--vendor", help="nvidia (NGC PyTorch base) or amd (ROCm PyTorch base).")
    ] = None,
    system: Annotated[
        str | None,
        typer.Option(
            "--system",
            "-s",
            help="Build what this system runs: its vendor and runtime; a .sqsh image path becomes --sqsh, "
            "another image name an extra --tag.",
        ),
    ] = None,
    overrides: SetOption = None,
    tags: Annotated[
        list[str] | None, typer.Option("--tag", help="Also tag the image with this name (repeatable).")
    ] = None,
    push: Annotated[
        str | None,
        typer.Option(
            "--push", metavar="REGISTRY", help="Push every tag to REGISTRY, e.g. registry.example.com/mlperf."
        ),
    ] = None,
    sqsh: Annotated[
        Path | None,
        typer.Option(
            "--sqsh",
            help="Also convert the image with 'enroot import' for Pyxis: a .sqsh file, or a folder that "
            "gets flux-cluster+<version>-<vendor>.sqsh.",
        ),
    ] = None,
    builder: Annotated[
        str | None,
        typer.Option(
            "--builder",
            help="docker or podman \\[default: the system's runtime, else docker if installed, else podman].",
            show_default=False,
        ),
    ] = None,
    base_image: Annotated[
        str | None,
        typer.Option(
            "--base-image",
            help="Build on another base than the Dockerfile's pinned one (a site mirror, a newer release).",
        ),
    ] = None,
    platform: Annotated[
        str | None, typer.Option("--platform", help="Target platform, e.g. linux/arm64 for Grace (GB200).")
    ] = None,
    context: Annotated[
        Path | None,
        typer.Option(
            "--context",
            help="flux-cluster source checkout to build \\[default: this installation's "
            "checkout, else the current folder].",
            show_default=False,
        ),
    ] = None,
    allow_dirty: Annotated[
        bool,
        typer.Option(
            "--allow-dirty",
            help="Build even if tracked files differ from the git commit "
            "(the revision label then ends in -dirty).",
        ),
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the commands and run nothing.")] = False,
) -> None:
    """Build the image (docker or podman), tag it with version and git revision, push it, make a .sqsh."""
    import shutil

    from flux_cluster.image import build as image_build
    from flux_cluster.image.names import VENDORS, is_file_image

    if (vendor is None) == (system is None):
        raise FluxClusterError("give exactly one of --vendor (nvidia or amd) and --system")
    extra_tags = [image_build.check_reference("--tag", t) for t in tags or []]
    sqsh_option, vendor_option = "--sqsh", "--vendor"
    if system is not None:  # build exactly what the system runs
        from flux_cluster.config import load_system

        config = load_system(system, overrides or []).config
        container, vendor, vendor_option = config.container, config.vendor, f"{system}: vendor"
        if container.runtime in image_build.BUILDERS and builder is None:
            builder = container.runtime
        image = container.image or ""
        if container.runtime == "pyxis" and is_file_image(image) and sqsh is None:
            sqsh, sqsh_option = Path(image), f"{system}: container.image"
        elif container.runtime in image_build.BUILDERS and image not in extra_tags:
            extra_tags.append(image_build.check_reference(f"{system}: container.image", image))
    if vendor not in VENDORS:
        raise FluxClusterError(f"{vendor_option} {vendor!r}: expected one of {', '.join(VENDORS)}")
    if builder is None:
        builder = image_build.default_builder()
    if builder not in image_build.BUILDERS:
        raise FluxClusterError(f"--builder {builder!r}: expected docker or podman")
    if push is not None:
        image_build.check_reference("--push", push, registry=True)
    if base_image is not None:
        image_build.check_reference("--base-image", base_image)

    root = _source_checkout(context, vendor)
    version = image_build.context_version(root)
    if sqsh is not None:
        sqsh = image_build.resolve_sqsh(sqsh, vendor, version, sqsh_option, must_exist=not dry_run)
    revision = image_build.git_revision(root)
    if revision is None or revision.endswith("-dirty"):
        problem = "is not a git checkout" if revision is None else "has uncommitted changes to tracked files"
        if not allow_dirty:
            raise FluxClusterError(
                f"{root} {problem}: the image would not match a commit (commit first, or pass --allow-dirty)"
            )
        typer.echo(f"warning: {root} {problem}; labelling the image as such", err=True)
        revision = revision or "unknown"
    request = image_build.BuildRequest(
        vendor=vendor,
        context=root,
        builder=builder,
        version=version,
        revision=revision,
        extra_tags=tuple(extra_tags),
        push=push,
        sqsh=sqsh,
        base_image=base_image,
        platform=platform,
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


def _source_checkout(context: Path | None, vendor: str) -> Path:
    import flux_cluster

    candidates = [context] if context else [Path(flux_cluster.__file__).resolve().parents[1], Path.cwd()]
    for candidate in candidates:
        if (candidate / "docker" / vendor / "Dockerfile").is_file():
            return candidate.absolute()
    where = context or "this installation or the current folder"
    raise FluxClusterError(
        f"no docker/{vendor}/Dockerfile in {where}: image build needs a flux-cluster source checkout "
        "(run it there, or pass --context)"
    )


def _print_usage(request: "BuildRequest") -> None:
    from flux_cluster.image.build import local_tags, pushed_name
    from flux_cluster.image.names import pyxis_reference, sqsh_name

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
