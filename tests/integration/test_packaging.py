"""A non-editable install carries the templates and the shipped systems inside the package."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_wheel_ships_templates_and_systems_and_renders(tmp_path: Path) -> None:
    wheel_dir = tmp_path / "wheel"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(REPO)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = wheel_dir.glob("flux_cluster-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "flux_cluster/_data/templates/sbatch.sh.j2" in names
    assert "flux_cluster/_data/configs/systems/dgx_h100x8.yaml" in names
    assert "flux_cluster/report/templates/report.html.j2" in names  # the HTML report's page
    # Data preparation is inside the package: no second top-level package.
    assert {"flux_cluster/data/loader.py", "flux_cluster/data/prep/convert.py"} <= set(names)
    tops = {name.split("/")[0] for name in names if "/" in name and ".dist-info/" not in name}
    assert tops == {"flux_cluster"}
    target = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr
    code = (
        "import flux_cluster.resources as r, sys; print(r.templates_dir()); "
        "from flux_cluster.cli import app; app(['submit', '--system', 'mi355x8', '--dry-run'])"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    first, *script = result.stdout.splitlines()
    assert first.startswith(str(target)), "templates must come from the installed package, not the checkout"
    assert "_fc_runtime=podman" in script
