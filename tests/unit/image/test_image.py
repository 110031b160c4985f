"""Container images without an engine: the lock against pyproject.toml and the installed packages, the
Dockerfiles (hadolint, structure), the build commands for every vendor and option, image names shared
with the system configs, and what 'systems show' says about an image. The real build is in
test_image_build.py."""

import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from typer.testing import CliRunner

from flux_cluster import __version__
from flux_cluster.cli import app
from flux_cluster.config import load_system
from flux_cluster.config.image_names import default_image, pyxis_reference, sqsh_name
from flux_cluster.errors import FluxClusterError
from flux_cluster.image import lock
from flux_cluster.image.build import (
    BuildRequest,
    Step,
    check_tools,
    git_revision,
    plan_build,
    resolve_sqsh,
    run_plan,
)

ROOT = Path(__file__).resolve().parents[3]
LOCK = ROOT / "requirements" / "runtime.lock"
VENDORS = ("nvidia", "amd")
BASES = {"nvidia": "nvcr.io/nvidia/pytorch:", "amd": "rocm/pytorch:"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# ---- the lock: what CI tests with is what the images install


def test_the_lock_satisfies_every_pyproject_dependency() -> None:
    pins = lock.read_lock(LOCK)
    for text in _pyproject()["project"]["dependencies"]:
        requirement = Requirement(text)
        name = lock.normalize(requirement.name)
        if lock.KEPT_FROM_BASE.match(name):
            assert name not in pins, f"{name} comes from the base image and must not be locked"
            continue
        assert name in pins, f"{text} is in pyproject.toml but not in {LOCK.name}: run tools/dev.sh lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} vs {text}"
    for text in _pyproject()["build-system"]["requires"]:  # the image builds the project offline
        assert lock.normalize(Requirement(text).name) in pins, f"build backend {text} is not locked"


def test_the_lock_is_closed_under_dependencies_so_no_deps_installs_work() -> None:
    pins = lock.read_lock(LOCK)
    for name in pins:
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
                continue
            needed = lock.normalize(requirement.name)
            assert needed in pins or lock.KEPT_FROM_BASE.match(needed), f"{name} needs {text}, not locked"


def test_this_environment_runs_exactly_the_locked_versions() -> None:
    problems = lock.mismatches(lock.read_lock(LOCK), lock.installed_versions())
    assert not problems, f"tests ran against other versions than {LOCK.name}: {problems}"


def test_lock_check_reports_a_version_mismatch(tmp_path: Path) -> None:
    pinned = tmp_path / "runtime.lock"
    pinned.write_text(f"# comment\njinja2=={metadata.version('jinja2')}\nrich==0.0.1\n")
    done = subprocess.run(
        [sys.executable, str(ROOT / "flux_cluster/image/lock.py"), "check", str(pinned)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert f"rich: locked 0.0.1, installed {metadata.version('rich')}" in done.stderr
    assert "jinja2" not in done.stderr
    with pytest.raises(lock.LockError, match=r"x.lock:2: expected 'name==version'"):
        lock.parse_lock("a==1\nb>=2\n", "x.lock")
    with pytest.raises(lock.LockError, match="pinned twice"):
        lock.parse_lock("PyYAML==6\npyyaml==6\n")


# ---- the Dockerfiles


def _dockerfile(vendor: str) -> list[str]:
    return (ROOT / "docker" / vendor / "Dockerfile").read_text().splitlines()


@pytest.mark.parametrize("vendor", VENDORS)
def test_dockerfile_pins_its_vendor_base_and_installs_dependencies_before_source(vendor: str) -> None:
    lines = [line for line in _dockerfile(vendor) if line and not line.startswith("#")]
    base = next(line for line in lines if line.startswith("ARG BASE_IMAGE="))
    image = base.split("=", 1)[1]
    assert image.startswith(BASES[vendor]) and not image.endswith((":latest", ":")), image
    assert lines.index(base) < next(
        i for i, line in enumerate(lines) if line.startswith("FROM ${BASE_IMAGE}")
    )
    order = [
        i
        for i, line in enumerate(lines)
        if "runtime.lock" in line or "install.sh" in line or line == "COPY . ."
    ]
    steps = [lines[i] for i in order]
    assert steps[0] == "COPY requirements/runtime.lock requirements/"
    assert steps.index("RUN bash /opt/flux-cluster-build/install.sh deps") < steps.index("COPY . .")
    assert steps[-1] == "RUN bash /opt/flux-cluster-build/install.sh project"
    # A new commit must not invalidate the install layers: its ARG comes after the last RUN.
    last_run = max(i for i, line in enumerate(lines) if line.startswith("RUN "))
    assert all(i > last_run for i, line in enumerate(lines) if line.startswith("ARG GIT_REVISION"))
    text = "\n".join(lines)
    for key in ("version", "revision", "base.name"):
        assert f"org.opencontainers.image.{key}=" in text
    secretish = re.compile(
        r"^(ARG|ENV)\s+\w*(TOKEN|SECRET|PASSWORD|KEY|CREDENTIAL)", re.IGNORECASE | re.MULTILINE
    )
    assert not secretish.search(text)


def test_install_script_installs_the_lock_without_deps_and_guards_torch() -> None:
    script = (ROOT / "docker" / "install.sh").read_text()
    assert '--no-deps "$@"' in script and '--requirement "$LOCK"' in script
    assert "LOCK=requirements/runtime.lock" in script
    assert script.count('torch_identity)" == ') == 2  # checked after the deps and after the project


def test_hadolint_passes_both_dockerfiles() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    files = [str(ROOT / "docker" / vendor / "Dockerfile") for vendor in VENDORS]
    done = subprocess.run([hadolint, *files], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # and it is really linting: a bad Dockerfile fails
    bad = subprocess.run(
        [hadolint, "-"],
        input="FROM debian\nRUN cd /tmp && apt-get install curl\n",
        text=True,
        capture_output=True,
    )
    assert bad.returncode != 0 and "DL3006" in bad.stdout


@pytest.mark.skipif(
    shutil.which("shellcheck") is None, reason="shellcheck is a Debian package (tools/dev.sh)"
)
def test_shellcheck_passes_the_install_and_testbase_scripts() -> None:
    done = subprocess.run(
        ["shellcheck", str(ROOT / "docker/install.sh"), str(ROOT / "docker/testbase/build.sh")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout


def test_dockerignore_admits_only_what_the_install_needs() -> None:
    rules = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert rules[0] == "*"
    admitted = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    for path in admitted:
        assert (ROOT / path).exists(), f".dockerignore admits {path}, which does not exist"
    for needed in ("pyproject.toml", "README.md", "flux_cluster", "configs", "slurm/templates"):
        assert needed in admitted  # the wheel build reads all of these
    assert not admitted & {".git", ".venv", "tests", "runs"}


# ---- build commands


def _request(tmp_path: Path, **changes: object) -> BuildRequest:
    fields = dict(vendor="nvidia", context=tmp_path, builder="docker", version="1.2.3", revision="a" * 40)
    return BuildRequest(**{**fields, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("builder", ["docker", "podman"])
def test_the_build_command_tags_version_and_revision(tmp_path: Path, vendor: str, builder: str) -> None:
    steps = plan_build(_request(tmp_path, vendor=vendor, builder=builder))
    assert [step.argv for step in steps] == [
        (
            builder, "build", "--file", str(tmp_path / "docker" / vendor / "Dockerfile"),
            "--tag", f"flux-cluster:1.2.3-{vendor}", "--tag", f"flux-cluster:1.2.3-gitaaaaaaaaaaaa-{vendor}",
            "--build-arg", "FLUX_CLUSTER_VERSION=1.2.3", "--build-arg", f"GIT_REVISION={'a' * 40}",
            str(tmp_path),
        )
    ]  # fmt: skip


def test_every_option_reaches_the_commands(tmp_path: Path) -> None:
    sqsh = tmp_path / "images" / "x.sqsh"
    request = _request(
        tmp_path,
        builder="podman",
        revision="b" * 40 + "-dirty",
        extra_tags=("site/flux:test",),
        push="registry.example.com:5000/mlperf",
        sqsh=sqsh,
        base_image="localhost/base:1",
        platform="linux/arm64",
    )
    steps = plan_build(request)
    build = steps[0].argv
    assert build[build.index("--platform") + 1] == "linux/arm64"
    assert "BASE_IMAGE=localhost/base:1" in build and f"GIT_REVISION={'b' * 40}-dirty" in build
    tags = [build[i + 1] for i, arg in enumerate(build) if arg == "--tag"]
    assert tags == [
        "flux-cluster:1.2.3-nvidia",
        "flux-cluster:1.2.3-gitbbbbbbbbbbbb-dirty-nvidia",
        "site/flux:test",
    ]
    pushed = [step.argv[-1] for step in steps if step.argv[1:2] == ("push",)]
    assert pushed == [f"registry.example.com:5000/mlperf/{tag}" for tag in tags]
    for tag in tags:  # each push follows its tag
        remote = f"registry.example.com:5000/mlperf/{tag}"
        assert ("podman", "tag", tag, remote) in [s.argv for s in steps]
    enroot, move = steps[-2], steps[-1]
    assert enroot.argv[:3] == ("enroot", "import", "--output")
    assert enroot.argv[-1] == "podman://flux-cluster:1.2.3-nvidia"
    partial = Path(enroot.argv[3])
    assert partial.parent == sqsh.parent and partial.name.startswith(".x.sqsh.partial-")
    assert move.rename == (partial, sqsh) and move.shell() == f"mv -f {partial} {sqsh}"
    docker = plan_build(_request(tmp_path, sqsh=sqsh))
    assert docker[-2].argv[-1] == "dockerd://flux-cluster:1.2.3-nvidia"


def test_missing_tools_are_named_before_anything_runs(tmp_path: Path) -> None:
    steps = plan_build(_request(tmp_path, sqsh=tmp_path / "x.sqsh"))
    with pytest.raises(FluxClusterError, match=r"^docker not found on PATH: .*--builder podman"):
        check_tools(steps, which=lambda tool: None)
    with pytest.raises(FluxClusterError, match=r"^enroot not found on PATH: .*enroot import --output"):
        check_tools(
            plan_build(_request(tmp_path, builder="podman", sqsh=tmp_path / "x.sqsh")),
            which=lambda tool: None if tool == "enroot" else f"/usr/bin/{tool}",
        )


def test_a_failed_step_stops_the_plan_and_leaves_no_partial_image(tmp_path: Path) -> None:
    partial, final = tmp_path / ".x.sqsh.partial", tmp_path / "x.sqsh"
    final.write_text("the previous image")
    steps = [
        Step("write", ("sh", "-c", f"echo half > {partial}; exit 3")),
        Step("move", rename=(partial, final)),
    ]
    with pytest.raises(FluxClusterError, match=r"write failed \(exit 3\)"):
        run_plan(steps, echo=lambda line: None)
    assert not partial.exists() and final.read_text() == "the previous image"
    run_plan([Step("write", ("sh", "-c", f"echo new > {partial}")), steps[1]], echo=lambda line: None)
    assert final.read_text() == "new\n" and not partial.exists()


def test_sqsh_folders_get_enroots_file_name(tmp_path: Path) -> None:
    assert resolve_sqsh(tmp_path, "amd", "1.0") == tmp_path / "flux-cluster+1.0-amd.sqsh"
    assert resolve_sqsh(tmp_path / "mine.sqsh", "amd", "1.0") == tmp_path / "mine.sqsh"
    with pytest.raises(FluxClusterError, match=r"ending in \.sqsh"):
        resolve_sqsh(tmp_path / "mine.img", "amd", "1.0")
    with pytest.raises(FluxClusterError, match="does not exist"):
        resolve_sqsh(tmp_path / "no" / "mine.sqsh", "amd", "1.0")
    # enroot names 'dockerd://flux-cluster:1.0-amd' the same way: ':' and '/' become '+'
    assert sqsh_name("amd", "1.0") == "flux-cluster:1.0-amd".replace(":", "+") + ".sqsh"


def test_git_revision_marks_uncommitted_changes(tmp_path: Path) -> None:
    assert git_revision(tmp_path) is None
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f").write_text("1")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert git_revision(tmp_path) == head
    (tmp_path / "untracked").write_text("ignored")
    assert git_revision(tmp_path) == head
    (tmp_path / "f").write_text("2")
    assert git_revision(tmp_path) == f"{head}-dirty"


# ---- the CLI


def test_dry_run_prints_the_commands_and_runs_nothing(cli: CliRunner, tmp_path: Path) -> None:
    result = cli.invoke(
        app,
        ["image", "build", "--vendor", "amd", "--builder", "podman", "--allow-dirty", "--dry-run",
         "--sqsh", str(tmp_path), "--push", "registry.example.com/mlperf"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    commands = [line for line in result.stdout.splitlines() if line]
    assert commands[0].startswith(f"podman build --file {ROOT}/docker/amd/Dockerfile --tag flux-cluster:")
    assert f"enroot import --output {tmp_path}/.flux-cluster+{__version__}-amd.sqsh.partial-" in result.stdout
    assert commands[-1].endswith(f" {tmp_path}/flux-cluster+{__version__}-amd.sqsh")
    assert not list(tmp_path.iterdir())
    revision = git_revision(ROOT)
    assert f"GIT_REVISION={revision}" in commands[0]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--vendor", "intel"], "--vendor 'intel': expected one of nvidia, amd"),
        ([], "give exactly one of --vendor"),
        (["--vendor", "amd", "--system", "mi300x8"], "give exactly one of --vendor"),
        (["--vendor", "amd", "--tag", "Bad Tag"], "--tag 'Bad Tag': expected a name"),
        (["--vendor", "amd", "--push", "https://reg"], "--push 'https://reg': expected"),
        (["--vendor", "amd", "--builder", "buildah"], "--builder 'buildah': expected docker or podman"),
        (["--vendor", "amd", "--sqsh", "/tmp/x.img"], "--sqsh /tmp/x.img: expected an existing folder"),
        (["--vendor", "amd", "--context", "/tmp"], "no docker/amd/Dockerfile in /tmp"),
        (["--system", "local_slurm"], "local_slurm: vendor 'cpu': expected one of nvidia, amd"),
    ],
)
def test_bad_input_is_one_line(cli: CliRunner, arguments: list[str], message: str) -> None:
    result = cli.invoke(app, ["image", "build", "--allow-dirty", "--dry-run", *arguments])
    assert result.exit_code == 2 and result.output.startswith(f"error: {message}"), result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_a_dirty_tree_is_refused_without_allow_dirty(cli: CliRunner, tmp_path: Path) -> None:
    context = tmp_path / "src"
    (context / "docker" / "amd").mkdir(parents=True)
    (context / "docker" / "amd" / "Dockerfile").write_text("FROM x\n")
    (context / "flux_cluster").mkdir()
    (context / "flux_cluster" / "__init__.py").write_text('__version__ = "9.9"\n')
    result = cli.invoke(app, ["image", "build", "--vendor", "amd", "--context", str(context), "--dry-run"])
    assert result.exit_code == 2 and "is not a git checkout" in result.output
    result = cli.invoke(
        app, ["image", "build", "--vendor", "amd", "--context", str(context), "--dry-run", "--allow-dirty"]
    )
    assert (
        result.exit_code == 0
        and "--tag flux-cluster:9.9-amd --tag flux-cluster:9.9-gitunknown-amd" in result.stdout
    )


def test_missing_builder_is_a_clear_error(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker, podman, enroot (nor git: hence --allow-dirty)
    result = cli.invoke(
        app, ["image", "build", "--vendor", "nvidia", "--allow-dirty", "--context", str(ROOT)]
    )
    assert result.exit_code == 2
    assert result.output.splitlines()[-1].startswith("error: docker not found on PATH: it builds the image")


# ---- names shared by the build and the system configs


@pytest.mark.parametrize(
    "system", ["dgx_h100x8", "dgx_b200x8", "gb200_nvl72", "mi300x8", "mi325x8", "mi355x8"]
)
def test_each_shipped_system_runs_the_image_the_build_makes(
    cli: CliRunner, system: str, tmp_path: Path
) -> None:
    sets = ["--set", f"container.image_dir={tmp_path}"]
    config = load_system(system, [f"container.image_dir={tmp_path}"]).config
    result = cli.invoke(app, ["image", "build", "--system", system, *sets, "--allow-dirty", "--dry-run"])
    assert result.exit_code == 0, result.output
    build = result.stdout.splitlines()[0]
    assert f"docker/{config.vendor}/Dockerfile" in build
    if config.container.runtime == "pyxis":
        assert config.container.image == f"{tmp_path}/flux-cluster+{__version__}-{config.vendor}.sqsh"
        assert result.stdout.splitlines()[-1].endswith(f" {config.container.image}")
    else:
        assert config.container.image == f"flux-cluster:{__version__}-{config.vendor}"
        assert build.startswith(config.container.runtime) and f"--tag {config.container.image} " in build


def test_default_image_follows_image_dir_then_registry() -> None:
    assert default_image("nvidia", "pyxis", "/img/", None, "2.0") == "/img/flux-cluster+2.0-nvidia.sqsh"
    assert default_image("nvidia", "pyxis", None, "reg.io/ml", "2.0") == "reg.io#ml/flux-cluster:2.0-nvidia"
    assert default_image("nvidia", "pyxis", None, None, "2.0") is None
    assert default_image("amd", "docker", None, "reg.io/ml", "2.0") == "reg.io/ml/flux-cluster:2.0-amd"
    assert default_image("amd", "podman", None, None, "2.0") == "flux-cluster:2.0-amd"
    assert default_image("cpu", "podman", None, None, "2.0") is None
    assert pyxis_reference("reg.io:5000", "amd", "2.0") == "reg.io:5000#flux-cluster:2.0-amd"


def test_config_errors_about_images_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(FluxClusterError, match=r"container.image: a .sqsh file must be an absolute path"):
        load_system("dgx_h100x8", ["container.image=images/flux.sqsh"])
    with pytest.raises(FluxClusterError, match=r"container.image is required .* container.image_dir"):
        load_system("dgx_h100x8", ["container.image_dir="])
    with pytest.raises(FluxClusterError, match=r"container.registry: .*expected a registry host"):
        load_system("mi300x8", ["container.registry=https://reg"])


def test_systems_show_tells_whether_the_sqsh_exists(cli: CliRunner, tmp_path: Path) -> None:
    args = ["systems", "show", "dgx_h100x8", "--set", f"container.image_dir={tmp_path}"]
    missing = cli.invoke(app, args)
    assert missing.exit_code == 0
    assert "image missing" in missing.stdout and "image build --system dgx_h100x8" in missing.stdout
    (tmp_path / sqsh_name("nvidia")).write_bytes(b"\0" * 1000)
    present = cli.invoke(app, args)
    assert "image present" in present.stdout and "image missing" not in present.stdout
    pulled = cli.invoke(
        app, ["systems", "show", "dgx_h100x8", "--set", "container.image=nvcr.io#nvidia/pytorch:25.09-py3"]
    )
    assert "Pyxis pulls it" in pulled.stdout
    assert "image" not in cli.invoke(app, ["systems", "show", "local"]).stdout.split("└")[-1]


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client here")
def test_systems_show_says_when_docker_cannot_be_asked(cli: CliRunner) -> None:
    from flux_cluster.image.build import docker_daemon_problem

    if docker_daemon_problem() is None:
        pytest.skip("a docker daemon answers here")
    result = cli.invoke(app, ["systems", "show", "mi300x8"])
    assert result.exit_code == 0 and "cannot check flux-cluster:" in result.stdout


def test_submit_warns_when_the_pyxis_image_is_missing(cli: CliRunner, workdir: Path, tmp_path: Path) -> None:
    args = ["submit", "--system", "dgx_h100x8", "--dry-run", "--set", f"container.image_dir={tmp_path}"]
    missing = cli.invoke(app, args)
    assert missing.exit_code == 0, missing.output
    assert f"warning: {tmp_path}/{sqsh_name('nvidia')} does not exist on this machine" in missing.stderr
    (tmp_path / sqsh_name("nvidia")).write_bytes(b"sqsh")
    assert "warning:" not in cli.invoke(app, args).stderr
