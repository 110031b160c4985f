"""Does the image a system names exist here? A .sqsh file is checked on disk, a docker/podman image with
'image inspect'; registry references are pulled at job start and are not checked."""

import json
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from flux_cluster import __version__
from flux_cluster.config.image_names import is_file_image
from flux_cluster.config.schema import ContainerConfig


@dataclass(frozen=True)
class ImageStatus:
    present: bool | None
    """None: cannot tell from this machine."""
    detail: str


def image_status(container: ContainerConfig) -> ImageStatus | None:
    """None when the system runs without a container."""
    if container.runtime == "none" or not container.image:
        return None
    if container.runtime == "pyxis":
        if not is_file_image(container.image):
            return ImageStatus(
                None, "registry image: Pyxis pulls it on every node at job start (not checked)"
            )
        return _file_status(Path(container.image))
    return _engine_status(container.runtime, container.image)


def _file_status(path: Path) -> ImageStatus:
    try:
        info = path.stat()
    except FileNotFoundError:
        return ImageStatus(False, f"{path} does not exist on this machine")
    except OSError as exc:
        return ImageStatus(None, f"{path}: {exc.strerror}")
    when = datetime.fromtimestamp(info.st_mtime).strftime("%Y-%m-%d %H:%M")
    return ImageStatus(True, f"{path} ({info.st_size / 1e9:.1f} GB, {when})")


def _engine_status(tool: str, image: str) -> ImageStatus:
    if shutil.which(tool) is None:
        return ImageStatus(None, f"cannot check {image}: {tool} is not installed on this machine")
    try:
        done = subprocess.run(
            [tool, "image", "inspect", "--format", "{{json .Config.Labels}}", image],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ImageStatus(None, f"cannot check {image}: '{tool} image inspect' did not answer in 30 s")
    if done.returncode != 0:
        error = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        if "no such" in error.lower() or "not known" in error.lower():
            return ImageStatus(False, f"{image} is not in this machine's {tool} images")
        return ImageStatus(None, f"cannot check {image}: {error}")
    labels = json.loads(done.stdout or "null") or {}
    version = labels.get("org.opencontainers.image.version", "?")
    revision = labels.get("org.opencontainers.image.revision", "?")
    detail = f"{image} (flux-cluster {version}, revision {revision[:12]})"
    if version != __version__:
        detail += f"; this is flux-cluster {__version__}: rebuild the image"
    return ImageStatus(True, detail)
