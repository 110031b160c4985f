"""The real image build: 'flux-cluster image build' runs podman on docker/amd/Dockerfile, on a locally
built stand-in for the vendor base (docker/testbase/build.sh: Debian 12, Python 3.11, CPU torch 2.13.0),
because no registry here serves NGC or ROCm images. This proves the Dockerfile's own steps: the locked
dependencies install without touching the base torch, the project installs, labels and tags are set,
the layers cache as intended, and 'systems show' finds the image."""

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import podman_builds
import pytest
from podman_builds import CANARY, TESTBASE

from flux_cluster import __version__
from flux_cluster.config.image_names import image_name
from flux_cluster.image.build import git_revision

ROOT = Path(__file__).resolve().parents[2]
IMAGE = image_name("amd")

pytestmark = [
    pytest.mark.podman,
    pytest.mark.skipif(
        not podman_builds.available(),
        reason="needs root with podman, runc and debootstrap (Debian packages installed by tools/dev.sh)",
    ),
]


def _podman(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=600)


def _build(env: dict[str, str], context: Path) -> subprocess.CompletedProcess[str]:
    done = podman_builds.build_image(env, context)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def _builds() -> Iterator[tuple[dict[str, str], subprocess.CompletedProcess[str]]]:
    """The base and the first build, started in the background when the session collected these tests."""
    env, done = podman_builds.BUILDS.wait()
    yield env, done
    # every image the tests built (their tags move between builds); the test base stays for the next run
    ids = _podman(env, "images", "--quiet", "--filter", "reference=localhost/flux-cluster:*").stdout.split()
    _podman(env, "rmi", "--force", *set(ids))


@pytest.fixture(scope="module")
def podman_env(_builds: tuple[dict[str, str], subprocess.CompletedProcess[str]]) -> dict[str, str]:
    return _builds[0]


@pytest.fixture(scope="module")
def built(
    _builds: tuple[dict[str, str], subprocess.CompletedProcess[str]],
) -> subprocess.CompletedProcess[str]:
    done = _builds[1]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_the_build_labels_and_tags_the_image(
    podman_env: dict[str, str], built: subprocess.CompletedProcess
) -> None:
    assert f"built {IMAGE}, flux-cluster:{__version__}-git" in built.stdout
    inspect = _podman(podman_env, "image", "inspect", IMAGE)
    assert inspect.returncode == 0, inspect.stderr
    info = json.loads(inspect.stdout)[0]
    labels = info["Config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.revision"] == (git_revision(ROOT) or "unknown")
    assert labels["org.opencontainers.image.base.name"] == TESTBASE
    revision_tag = next(t for t in info["RepoTags"] if "-git" in t)
    assert revision_tag.endswith("-amd") and (git_revision(ROOT) or "unknown")[:12] in revision_tag
    history = _podman(podman_env, "history", "--no-trunc", IMAGE).stdout
    assert CANARY not in inspect.stdout + history


def test_the_image_keeps_the_base_torch_and_has_exactly_the_locked_packages(
    podman_env: dict[str, str], built: subprocess.CompletedProcess
) -> None:
    script = (
        "set -e; python -c 'import torch; print(torch.__version__, torch.__file__)'; "
        "python flux_cluster/image/lock.py check requirements/runtime.lock && echo lock-ok; "
        "flux-cluster --version; flux-cluster systems list >/dev/null && echo systems-ok; ls -A"
    )
    done = _podman(podman_env, "run", "--rm", IMAGE, "bash", "-c", script)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "2.13.0+cpu /opt/venv/lib/python3.11/site-packages/torch/__init__.py"  # the base's
    assert "lock-ok" in lines and "systems-ok" in lines and f"flux-cluster {__version__}" in lines
    workdir = set(lines[lines.index("systems-ok") + 1 :])
    assert {"flux_cluster", "configs", "pyproject.toml"} <= workdir
    assert not workdir & {".git", ".venv", "tests", "runs", "benchmarks"}


def test_a_code_change_rebuilds_only_the_project_layer(
    podman_env: dict[str, str], built: subprocess.CompletedProcess, tmp_path: Path
) -> None:
    context = tmp_path / "src"
    shutil.copytree(ROOT, context, ignore=shutil.ignore_patterns(".git", ".venv", "runs", "__pycache__"))
    init = context / "flux_cluster" / "__init__.py"
    init.write_text(init.read_text() + "# a code change\n")
    output = _build(podman_env, context).stdout.splitlines()

    def cached(step: str) -> bool:
        at = next(i for i, line in enumerate(output) if line.startswith("STEP") and line.endswith(step))
        return output[at + 1].startswith("--> Using cache")

    assert cached("install.sh deps")
    assert not cached("install.sh project")


def test_systems_show_finds_the_built_image(
    podman_env: dict[str, str], built: subprocess.CompletedProcess
) -> None:
    flux = str(Path(sys.executable).with_name("flux-cluster"))
    done = subprocess.run(
        [flux, "systems", "show", "mi355x8"], env=podman_env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert f"image present: {IMAGE} (flux-cluster {__version__}, revision" in " ".join(done.stdout.split())
