"""The CLI through Typer's CliRunner: systems, dry-run rendering, and every error case as one clean line."""

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from flux_cluster.cli import app
from flux_cluster.rundir import RunRecord, list_runs


def error_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_help_does_not_import_torch() -> None:
    code = "import sys; from flux_cluster.cli import app; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    result = subprocess.run([sys.executable, "-m", "flux_cluster", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "submit" in result.stdout and "preflight" in result.stdout


def test_systems_list_shows_every_shipped_system(cli: CliRunner, shipped_systems: tuple[str, ...]) -> None:
    result = cli.invoke(app, ["systems", "list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in shipped_systems:
        assert name in result.output
    assert "18 x 4" in result.output  # gb200_nvl72


def test_systems_show_tells_where_values_come_from(cli: CliRunner) -> None:
    result = cli.invoke(
        app,
        ["systems", "show", "dgx_h100x8", "--set", "nodes=4", "--format", "json"],
        env={"FLUX_DATA_ROOT": "/site/energon"},
    )
    assert result.exit_code == 0
    import json

    rows = json.loads(result.output)
    assert rows["nodes"] == {"value": 4, "source": "--set"}
    assert rows["vendor"]["source"].endswith("_nvidia_dgx.yaml")
    assert rows["paths.data_root"]["value"] == "/site/energon"
    assert "${FLUX_DATA_ROOT}" in rows["paths.data_root"]["source"]
    assert rows["slurm.qos"]["source"] == "default"
    table = cli.invoke(app, ["systems", "show", "mi300x8"], env={"COLUMNS": "200"})
    assert (
        table.exit_code == 0 and "container.runtime" in table.output and "_amd_instinct.yaml" in table.output
    )


def test_dry_run_prints_the_script_it_prepared(cli: CliRunner, workdir: Path) -> None:
    result = cli.invoke(app, ["submit", "--system", "dgx_h100x8", "--dry-run", "--nexp", "10", "--seed", "5"])
    assert result.exit_code == 0
    script = result.stdout
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=flux-train-dgx_h100x8\n")
    assert "NEXP=10" in script and "SEED_BASE=5" in script and "--container-image=" in script
    (run_dir,) = list_runs(workdir / "runs")
    assert (run_dir / "job.sh").read_text() == script, "stdout is exactly the prepared script"
    assert (run_dir / "config.yaml").is_file() and (run_dir / "slurm").is_dir()  # what sbatch needs
    record = RunRecord.load(run_dir)
    assert record is not None and record.launcher == "dry-run" and record.job_ids == []
    check = subprocess.run(["bash", "-n"], input=script, text=True)
    assert check.returncode == 0


def test_dry_run_overrides_change_the_script(cli: CliRunner, workdir: Path) -> None:
    result = cli.invoke(
        app,
        [
            "submit",
            "--system",
            "dgx_h100x8",
            "--dry-run",
            "--set",
            "nodes=4",
            "--set",
            "slurm.partition=batch",
            "--set",
            "env.NCCL_DEBUG=INFO",
            "--dependency",
            "afterok:123",
        ],
    )
    assert result.exit_code == 0
    for needle in (
        "#SBATCH --nodes=4",
        "#SBATCH --partition=batch",
        "export NCCL_DEBUG=INFO",
        "#SBATCH --dependency=afterok:123",
    ):
        assert needle in result.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["submit", "--system", "dgx_h100", "--dry-run"],
            "unknown system 'dgx_h100' (did you mean 'dgx_h100x8'?)",
        ),
        (
            ["submit", "--system", "local", "--set", "gpus_per_nod=2", "--dry-run"],
            "did you mean 'gpus_per_node'",
        ),
        (
            ["submit", "--system", "local", "--set", "nodes=two", "--dry-run"],
            "nodes: got 'two' (str), expected",
        ),
        (["submit", "--system", "local", "--set", "nodes", "--dry-run"], "expected KEY=VALUE"),
        (["submit", "--system", "local_slurm", "--dependency", "whenever:1", "--dry-run"], "--dependency"),
        (["submit", "--system", "local", "--job", "bake", "--dry-run"], "unknown job 'bake'"),
        (["systems", "show", "mi300x9"], "unknown system 'mi300x9'"),
        (["systems", "show", "local", "--format", "xml"], "--format 'xml'"),
        (["status", "nope"], "run 'nope': no such run under runs"),
        (["logs"], "no runs under runs; submit one"),
        (["submit", "--system", "local_slurm", "--experiment", "a b", "--dry-run"], "--experiment 'a b'"),
    ],
)
def test_errors_are_one_clean_line(cli: CliRunner, workdir: Path, args: list[str], expected: str) -> None:
    assert expected in error_line(cli.invoke(app, args))


def test_wrong_type_in_a_site_file_names_file_key_value_and_type(cli: CliRunner, workdir: Path) -> None:
    (workdir / "site.yaml").write_text("extends: dgx_h100x8\nslurm:\n  cpus_per_task: lots\n")
    line = error_line(cli.invoke(app, ["systems", "show", "site.yaml"]))
    assert line == (
        "error: site.yaml: slurm.cpus_per_task: got 'lots' (str), expected a valid integer, "
        "unable to parse string as an integer"
    )


def test_site_systems_folder_is_searched_first(cli: CliRunner, workdir: Path) -> None:
    site = workdir / "site"
    site.mkdir()
    (site / "mycluster.yaml").write_text(
        "extends: dgx_h100x8\nnodes: 16\nslurm: {partition: mlperf}\ntrain: {global_batch_size: 2048}\n"
    )
    env = {"FLUX_CLUSTER_SYSTEMS": str(site), "COLUMNS": "200"}
    assert "mycluster" in cli.invoke(app, ["systems", "list"], env=env).output
    result = cli.invoke(app, ["submit", "--system", "mycluster", "--dry-run"], env=env)
    assert (
        result.exit_code == 0
        and "#SBATCH --nodes=16" in result.stdout
        and "--partition=mlperf" in result.stdout
    )


def test_run_paths_that_slurm_cannot_take_are_refused(cli: CliRunner, workdir: Path) -> None:
    line = error_line(
        cli.invoke(app, ["submit", "--system", "local_slurm", "--dry-run", "--runs-dir", "my runs"])
    )
    assert "no spaces" in line


def test_systems_list_flags_an_invalid_site_system(cli: CliRunner, workdir: Path) -> None:
    (workdir / "broken.yaml").write_text("extends: local\nnodes: many\n")
    result = cli.invoke(app, ["systems", "list"], env={"FLUX_CLUSTER_SYSTEMS": str(workdir), "COLUMNS": "80"})
    assert result.exit_code == 0 and "invalid" in result.output
    assert "broken" in result.output and "nodes: got 'many'" in result.output.replace("\n", "")
