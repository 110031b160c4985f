"""What 'flux-cluster image build' builds: its options (or a system's vendor, runtime and image) checked
and resolved into a BuildRequest, each bad value one line naming its option."""

from collections.abc import Callable, Sequence
from pathlib import Path

from flux_cluster.config.image_names import VENDORS, is_file_image
from flux_cluster.errors import FluxClusterError
from flux_cluster.image import build as image_build


def build_request(
    *,
    vendor: str | None,
    system: str | None,
    overrides: Sequence[str] = (),
    tags: Sequence[str] = (),
    push: str | None = None,
    sqsh: Path | None = None,
    builder: str | None = None,
    base_image: str | None = None,
    platform: str | None = None,
    context: Path | None = None,
    allow_dirty: bool = False,
    dry_run: bool = False,
    warn: Callable[[str], None] = lambda line: None,
) -> image_build.BuildRequest:
    """The build as asked: exactly one of vendor and system (a system: its vendor, its runtime as the
    builder, a .sqsh image as sqsh, another image name as an extra tag). warn: a line for a checkout
    that does not match its commit (allow_dirty)."""
    if (vendor is None) == (system is None):
        raise FluxClusterError("give exactly one of --vendor (nvidia or amd) and --system")
    extra_tags = [image_build.check_reference("--tag", t) for t in tags]
    sqsh_option, vendor_option = "--sqsh", "--vendor"
    if system is not None:  # build exactly what the system runs
        from flux_cluster.config import load_system

        config = load_system(system, list(overrides)).config
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

    root = source_checkout(context, vendor)
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
        warn(f"warning: {root} {problem}; labelling the image as such")
        revision = revision or "unknown"
    return image_build.BuildRequest(
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


def source_checkout(context: Path | None, vendor: str) -> Path:
    """The build context: context, else this installation's checkout, else the current folder; the one
    holding docker/<vendor>/Dockerfile."""
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
