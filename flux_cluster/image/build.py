"""Turn an image request into the commands that build, tag, push and convert it, and run them.

The plan is plain data (argv lists), so ``--dry-run`` prints exactly what a real run executes and
tests check the command construction without a Docker engine.
"""

import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from flux_cluster.config.image_names import IMAGE_REFERENCE, REGISTRY, image_name, revision_name, sqsh_name
from flux_cluster.errors import FluxClusterError

BUILDERS = ("docker", "podman")
_ENROOT_SOURCE = {"docker": "dockerd", "podman": "podman"}  # enroot import URI schemes for a local image


@dataclass(frozen=True)
class BuildRequest:
    vendor: str
    context: Path
    """A flux-cluster source checkout: the build context (docker/<vendor>/Dockerfile, .dockerignore)."""
    builder: str
    version: str
    revision: str
    """Full git commit of the context, '-dirty' appended when tracked files differ from it."""
    extra_tags: tuple[str, ...] = ()
    push: str | None = None
    """Registry to push every tag to, e.g. 'registry.example.com/mlperf'."""
    sqsh: Path | None = None
    """Final .sqsh path for Pyxis (enroot import), already resolved to a file name."""
    base_image: str | None = None
    platform: str | None = None


@dataclass(frozen=True)
class Step:
    what: str
    argv: tuple[str, ...] = ()
    rename: tuple[Path, Path] | None = None
    """Instead of a command: move a finished file into place (atomic within one file system)."""

    def shell(self) -> str:
        if self.rename:
            return shlex.join(["mv", "-f", str(self.rename[0]), str(self.rename[1])])
        return shlex.join(self.argv)


def local_tags(request: BuildRequest) -> list[str]:
    names = [
        image_name(request.vendor, request.version),
        revision_name(request.vendor, request.version, request.revision),
    ]
    return names + [t for t in request.extra_tags if t not in names]


def pushed_name(registry: str, tag: str) -> str:
    return f"{registry.rstrip('/')}/{tag}"


def partial_sqsh(final: Path) -> Path:
    # enroot refuses to overwrite; a hidden name in the same folder makes the final rename atomic.
    return final.with_name(f".{final.name}.partial-{os.getpid()}.sqsh")


def plan_build(request: BuildRequest) -> list[Step]:
    tags = local_tags(request)
    dockerfile = request.context / "docker" / request.vendor / "Dockerfile"
    build = [request.builder, "build", "--file", str(dockerfile)]
    for tag in tags:
        build += ["--tag", tag]
    build += ["--build-arg", f"FLUX_CLUSTER_VERSION={request.version}"]
    build += ["--build-arg", f"GIT_REVISION={request.revision}"]
    if request.base_image:
        build += ["--build-arg", f"BASE_IMAGE={request.base_image}"]
    if request.platform:
        build += ["--platform", request.platform]
    steps = [Step(f"build {tags[0]}", (*build, str(request.context)))]
    if request.push:
        for tag in tags:
            remote = pushed_name(request.push, tag)
            steps.append(Step(f"tag {remote}", (request.builder, "tag", tag, remote)))
            steps.append(Step(f"push {remote}", (request.builder, "push", remote)))
    if request.sqsh:
        partial = partial_sqsh(request.sqsh)
        source = f"{_ENROOT_SOURCE[request.builder]}://{tags[0]}"
        steps.append(
            Step(f"enroot import {request.sqsh}", ("enroot", "import", "--output", str(partial), source))
        )
        steps.append(Step(f"move into place {request.sqsh}", rename=(partial, request.sqsh)))
    return steps


def required_tools(steps: Sequence[Step]) -> list[str]:
    return sorted({step.argv[0] for step in steps if step.argv})


def docker_daemon_problem() -> str | None:
    """docker is a client: it can be installed with no daemon to talk to (as on this project's CI)."""
    try:
        done = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    lines = done.stderr.strip().splitlines()
    return None if done.returncode == 0 else (lines[-1] if lines else f"exit {done.returncode}")


def default_builder(which: Callable[[str], str | None] = shutil.which) -> str:
    """docker when its daemon answers, else podman when installed, else docker (whose check then explains)."""
    if which("docker") and docker_daemon_problem() is None:
        return "docker"
    return "podman" if which("podman") else "docker"


def check_tools(steps: Sequence[Step], which: Callable[[str], str | None] = shutil.which) -> None:
    """Fail before anything runs: a 20-minute build should not end in 'enroot: not found'."""
    for tool in required_tools(steps):
        if which(tool) is None:
            raise FluxClusterError(f"{tool} not found on PATH: {_why(tool, steps)}")
        if tool == "docker" and (problem := docker_daemon_problem()):
            raise FluxClusterError(
                f"docker cannot reach its daemon ({problem}): start it, or pass --builder podman"
            )


def _why(tool: str, steps: Sequence[Step]) -> str:
    if tool == "enroot":
        command = next(step.shell() for step in steps if step.argv[:1] == ("enroot",))
        return f"--sqsh needs it; build without --sqsh and run this where enroot is: {command}"
    other = "podman" if tool == "docker" else "docker"
    return f"it builds the image (install {tool}, or pass --builder {other})"


def run_plan(steps: Sequence[Step], echo: Callable[[str], None]) -> None:
    """Run each step, its output (the builder's progress) on the terminal; stop at the first failure."""
    for number, step in enumerate(steps, 1):
        echo(f"[{number}/{len(steps)}] {step.what}: {step.shell()}")
        started = time.monotonic()
        if step.rename:
            os.replace(*step.rename)
        else:
            code = subprocess.run(step.argv, check=False).returncode
            if code != 0:
                for other in steps:  # never leave a half-written image behind
                    if other.rename:
                        other.rename[0].unlink(missing_ok=True)
                raise FluxClusterError(f"{step.what} failed (exit {code}): {step.shell()}")
        echo(f"[{number}/{len(steps)}] done in {time.monotonic() - started:.0f} s")


def git_revision(context: Path) -> str | None:
    """The context's commit, '-dirty' when tracked files differ from it; None outside a git checkout."""
    if shutil.which("git") is None or not (context / ".git").exists():
        return None

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(context), *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise FluxClusterError(f"git {' '.join(args)} in {context} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    revision = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{revision}-dirty" if dirty else revision


def context_version(context: Path) -> str:
    """The version of the code being built (the context may be another checkout than the running tool)."""
    init = context / "flux_cluster" / "__init__.py"
    match = re.search(r'^__version__ = "([^"]+)"', init.read_text(), re.MULTILINE) if init.is_file() else None
    if not match:
        raise FluxClusterError(f'{init}: no __version__ = "..." line; is {context} a flux-cluster checkout?')
    return match.group(1)


def check_reference(option: str, value: str, registry: bool = False) -> str:
    pattern = REGISTRY if registry else IMAGE_REFERENCE
    if not pattern.fullmatch(value):
        example = "registry.example.com/mlperf" if registry else "site/flux-cluster:test"
        raise FluxClusterError(
            f"{option} {value!r}: expected a name such as {example!r} (lowercase repository)"
        )
    return value


def resolve_sqsh(
    path: Path, vendor: str, version: str, option: str = "--sqsh", must_exist: bool = True
) -> Path:
    """A folder gets enroot's own file name for the image; a file must end in .sqsh."""
    path = path.expanduser().absolute()
    if path.is_dir():
        path = path / sqsh_name(vendor, version)
    elif path.suffix != ".sqsh":
        raise FluxClusterError(f"{option} {path}: expected an existing folder or a file name ending in .sqsh")
    if must_exist and not path.parent.is_dir():
        raise FluxClusterError(f"{option} {path}: folder {path.parent} does not exist")
    return path
