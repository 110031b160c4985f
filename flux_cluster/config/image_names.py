"""The image names 'flux-cluster image build' produces; system configs default to the same names.

A build for version V tags ``flux-cluster:V-<vendor>`` (what configs name) and
``flux-cluster:V-git<rev>-<vendor>`` (the exact commit). Pyxis sites import it into
``flux-cluster+V-<vendor>.sqsh``, the file name enroot itself gives that image.
"""

import re

from flux_cluster import __version__

REPOSITORY = "flux-cluster"
VENDORS = ("nvidia", "amd")
# A docker/OCI reference: optional registry host[:port] and path, repository, optional tag.
IMAGE_REFERENCE = re.compile(
    r"^(?:[A-Za-z0-9.-]+(?::\d+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$"
)
REGISTRY = re.compile(r"^[A-Za-z0-9.-]+(?::\d+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")


def _tag_safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)


def image_tag(vendor: str, version: str = __version__) -> str:
    return f"{_tag_safe(version)}-{vendor}"


def image_name(vendor: str, version: str = __version__, registry: str | None = None) -> str:
    """'flux-cluster:0.1.0-nvidia', or 'REGISTRY/flux-cluster:0.1.0-nvidia' for docker/podman pulls."""
    name = f"{REPOSITORY}:{image_tag(vendor, version)}"
    return f"{registry.rstrip('/')}/{name}" if registry else name


def revision_name(vendor: str, version: str, revision: str) -> str:
    """The tag that names the exact commit: 'flux-cluster:0.1.0-git8cfe621a1b2c-nvidia'."""
    short = revision[:12] + ("-dirty" if revision.endswith("-dirty") else "")
    return f"{REPOSITORY}:{_tag_safe(version)}-git{_tag_safe(short)}-{vendor}"


def sqsh_name(vendor: str, version: str = __version__) -> str:
    """enroot's file name for the image: ':' and '/' become '+'."""
    return f"{REPOSITORY}+{image_tag(vendor, version)}.sqsh"


def pyxis_reference(registry: str, vendor: str, version: str = __version__) -> str:
    """Pyxis/enroot spell a registry image 'host#path/name:tag'."""
    host, _, path = registry.rstrip("/").partition("/")
    return f"{host}#{path + '/' if path else ''}{REPOSITORY}:{image_tag(vendor, version)}"


def is_file_image(image: str) -> bool:
    """Pyxis reads a value as a file only when it starts with '/' or './'; anything else it pulls."""
    return image.startswith(("/", "./"))


def default_image(
    vendor: str, runtime: str, image_dir: str | None, registry: str | None, version: str = __version__
) -> str | None:
    """The built image a system runs when its config names none (None: it cannot tell)."""
    if vendor not in VENDORS or runtime == "none":
        return None
    if runtime == "pyxis":
        if image_dir:
            return f"{image_dir.rstrip('/')}/{sqsh_name(vendor, version)}"
        return pyxis_reference(registry, vendor, version) if registry else None
    return image_name(vendor, version, registry)
