"""Shared fixtures: the CLI runner, a clean working directory, the real localhost Slurm cluster, the tiny
Hugging Face models and a call bounded in time (hostile-input tests)."""

import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

from flux_cluster.atomic import write_atomic

if TYPE_CHECKING:
    from flux_cluster.runtime.dist import DistInfo

REPO = Path(__file__).resolve().parent.parent
SHIPPED_SYSTEMS = (
    "dgx_h100x8",
    "dgx_h200x8",
    "dgx_b200x8",
    "gb200_nvl72",
    "mi300x8",
    "mi325x8",
    "mi355x8",
    "local",
    "local_slurm",
    "local_gpu",
    "aws_p5",
    "gcp_a3_highgpu",
    "azure_nd_h100_v5",
    "ondemand_h100x8",
)
CLUSTER_SCRIPT = REPO / "slurm" / "local-cluster.sh"


WAITING_MARKERS = ("slurm", "podman")
"""Tests that mostly wait: on the localhost Slurm cluster (scheduling, requeues, walltime signals) or on
the image builds (downloads, unpacking)."""
WAITING_TESTS_ENV = "FLUX_TESTS_WAITING_LIST"
"""Under pytest-xdist: the file where the workers list the waiting tests' ids for the scheduler."""


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist's controller (tools/dev.sh test: -n 2): a file for the waiting tests' ids, which its
    workers (started after this) write and the scheduler below reads."""
    if getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        import tempfile

        os.environ[WAITING_TESTS_ENV] = str(Path(tempfile.mkdtemp(prefix="flux-tests-")) / "waiting.txt")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Two groups for pytest-xdist's workers, each run in collection order on one worker: the tests that
    mostly wait (WAITING_MARKERS) beside all the others, so the waits overlap work without two CPU-bound
    tests competing, and the Slurm cluster and the image builds have one user each. (pytest-xdist's own
    loadgroup cannot do it under pytest 9: its group suffix never reaches the test ids.)"""
    if config.getvalue("dist") != "load":  # another --dist asked for: pytest-xdist's own
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WaitingBeside(LoadScopeScheduling):
        waiting: set[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.waiting is None:  # every worker has collected (and listed) by the first call
                self.waiting = set(Path(os.environ[WAITING_TESTS_ENV]).read_text().splitlines())
            return "waiting" if nodeid in self.waiting else "other"

    return WaitingBeside(config, log)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start the image build tests' set-up now, in the background (tests/podman_builds.py); not for a
    collection only (it would outlive the session). A pytest-xdist worker lists the waiting tests instead
    (pytest_xdist_make_scheduler): the image build tests' worker runs the set-up when they need it."""
    import podman_builds

    if os.environ.get("PYTEST_XDIST_WORKER"):
        waiting = [item.nodeid for item in items if any(map(item.get_closest_marker, WAITING_MARKERS))]
        write_atomic(Path(os.environ[WAITING_TESTS_ENV]), "".join(f"{nodeid}\n" for nodeid in waiting))
        return
    if config.option.collectonly:
        return
    if podman_builds.available() and any(item.get_closest_marker("podman") for item in items):
        podman_builds.BUILDS.start()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/* from the templates")


@pytest.fixture(autouse=True, scope="session")
def _private_secrets_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Secrets a test submits land in a temporary folder, never in ~/.config/flux-cluster/secrets."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLUX_CLUSTER_SECRETS", str(tmp_path_factory.mktemp("secrets")))
        yield


@pytest.fixture(autouse=True, scope="session")
def _session_user_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The user cache (XDG_CACHE_HOME: the systems' synthetic datasets, encode caches) is a folder of this
    session: a system's synthetic dataset is made once and shared by every test (and Slurm job) that trains
    on it, and nothing lands in the real ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("user-cache")))
        yield


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-init FLUX.1-schnell pipeline folder (flux-cluster models tiny, seed 0), written once per
    session; treat it as read-only."""
    from flux_cluster.models.tiny import write_tiny_pipeline  # imports torch and diffusers

    return write_tiny_pipeline(tmp_path_factory.mktemp("tiny_pipeline") / "flux-tiny")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def shipped_systems() -> tuple[str, ...]:
    """The systems the issue requires the project to ship."""
    return SHIPPED_SYSTEMS


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator["DistInfo"]:
    """A one-rank gloo process group (what a job's collectives need), torn down after the test."""
    import torch
    import torch.distributed as dist

    from flux_cluster.runtime.dist import DistInfo

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield DistInfo(rank=0, world_size=1, local_rank=0, backend="gloo", device=torch.device("cpu"))
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bert/, gpt2/ and vit/: the tiny random-init models of `flux-cluster models tiny`."""
    from flux_cluster.models.tiny_hf import write_tiny_hf

    root = tmp_path_factory.mktemp("tiny_hf")
    for kind in ("bert", "gpt2", "vit"):
        write_tiny_hf(root / kind, kind=kind)  # type: ignore[arg-type]
    return root


@pytest.fixture
def within() -> Callable[..., BaseException | None]:
    """within(seconds, call, *fifos): the exception call raises (None if none), failing the test when it
    has not returned after seconds. A call blocked opening one of the FIFOs is released first (a writer
    opens and closes it), so a failing test ends instead of hanging the suite."""

    def run(seconds: float, call: Callable[[], Any], *fifos: Path) -> BaseException | None:
        outcome: list[BaseException | None] = []

        def target() -> None:
            try:
                call()
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        thread.join(seconds)
        if thread.is_alive():
            for fifo in fifos:  # unblock a reader stuck in open(): it reads end-of-file
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            thread.join(10)
            pytest.fail(f"did not return within {seconds} s (blocked on a FIFO?)")
        return outcome[0]

    return run


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run each test from an empty directory with no inherited runs/systems settings."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLUX_CLUSTER_RUNS", raising=False)
    monkeypatch.delenv("FLUX_CLUSTER_SYSTEMS", raising=False)
    return tmp_path


def _cluster(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(CLUSTER_SCRIPT), command], capture_output=True, text=True, check=False)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A real slurmctld + 2 slurmd + slurmdbd/mariadb on localhost, started by slurm/local-cluster.sh."""
    if os.geteuid() != 0:
        pytest.skip("the localhost Slurm cluster needs root (Debian packages and daemons)")
    if shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed: run 'tools/dev.sh test' as root, which installs it")
    already_running = _cluster("status").returncode == 0
    started = already_running or _cluster("start")
    if started is not True and started.returncode != 0:
        pytest.fail(f"could not start the local Slurm cluster:\n{started.stdout}\n{started.stderr}")
    env_line = _cluster("env").stdout.strip()
    slurm_conf = env_line.split("=", 1)[1].strip("'\"")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = slurm_conf
    yield {"SLURM_CONF": slurm_conf}
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    if not already_running:
        _cluster("stop")
