"""The image build tests' slow set-up, the stand-in vendor base (docker/testbase/build.sh) and then the
first image build (about 3 minutes together, mostly downloads and unpacking), started in a background
thread as soon as the session has collected those tests, so it overlaps the tests that run before them
instead of adding to CI's 30 minutes. The tests wait for it (tests/integration/test_image_build.py)."""

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTBASE = "localhost/flux-cluster-testbase:bookworm-torch2.13.0"
CANARY = "hf_canary_7f3a9c"  # a secret in the builder's environment must not reach the image
TIMEOUT_S = 900


def available() -> bool:
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("podman", "runc", "debootstrap"))


def podman_env() -> dict[str, str]:
    # This sandbox runs containers with runc and low ulimits (see the platform notes); sites need neither.
    conf = Path(tempfile.mkdtemp(prefix="flux-cluster-podman-")) / "containers.conf"
    ulimits = '["nofile=1024:1024", "nproc=1024:1024"]'
    conf.write_text(f'[containers]\ndefault_ulimits = {ulimits}\n[engine]\nruntime = "runc"\n')
    return {**os.environ, "CONTAINERS_CONF": str(conf), "HF_TOKEN": CANARY}


def build_image(env: dict[str, str], context: Path) -> subprocess.CompletedProcess[str]:
    command = [
        *(str(Path(sys.executable).with_name("flux-cluster")), "image", "build", "--vendor", "amd"),
        *("--builder", "podman", "--base-image", TESTBASE, "--allow-dirty", "--context", str(context)),
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


class _Builds:
    def __init__(self) -> None:
        self.env: dict[str, str] = {}
        self.testbase: subprocess.CompletedProcess[str] | None = None
        self.image: subprocess.CompletedProcess[str] | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is None:
            self.env = podman_env()
            self.thread = threading.Thread(target=self._run, name="podman-builds", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        script = ["bash", str(ROOT / "docker/testbase/build.sh"), TESTBASE]
        self.testbase = subprocess.run(
            script, env=self.env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
        if self.testbase.returncode == 0:
            self.image = build_image(self.env, ROOT)

    def wait(self) -> tuple[dict[str, str], subprocess.CompletedProcess[str]]:
        """The podman environment and the first image build, once both are done (a failed base fails)."""
        self.start()
        assert self.thread is not None
        self.thread.join(2 * TIMEOUT_S)
        assert self.testbase is not None, "the test base build did not finish"
        assert self.testbase.returncode == 0, self.testbase.stdout[-3000:] + self.testbase.stderr[-3000:]
        assert self.image is not None
        return self.env, self.image


BUILDS = _Builds()
