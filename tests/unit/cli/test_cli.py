"""The CLI through Typer's CliRunner: systems, dry-run rendering, and every error case as one clean line."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_errors import error_line, one_line_error
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.rundir import RunRecord, list_runs


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
        # usage errors Typer would draw in a box
        (["report", "--price", "-1"], "error: --price '-1': expected SYSTEM=USD or USD, USD a number >= 0"),
        (["report", "--format", "xml"], "'xml' is not one of 'table', 'json'"),
        (["submit", "--nexp", "abc"], "flux-cluster submit: Invalid value for '--nexp'"),
        (["preflight", "--soak-seconds", "abc"], "Invalid value for '--soak-seconds'"),
        (["--bogus"], "flux-cluster: No such option: --bogus"),
        (["runs", "list", "--bogus"], "flux-cluster runs list: No such option: --bogus"),
        (["systems", "show"], "flux-cluster systems show: Missing argument 'name'"),
        (["bake"], "No such command 'bake'"),
        (["logs", "--task", "x"], "Invalid value for '--task'"),
        # other commands' own checks
        (["report", "nowhere"], "nowhere: no such file or directory"),
        (["data", "info", "nowhere"], "nowhere: no such directory"),
        (["data", "synth", "out", "--format", "xml"], "--format 'xml': expected arrow or parquet"),
        (["prepare-data", "--stage", "bake"], "--stage 'bake': expected one of download"),
        (["image", "build", "--vendor", "intel", "--dry-run"], "--vendor 'intel': expected one of"),
        (["runs", "requeue"], "no runs under runs"),
        (["cancel"], "no runs under runs"),
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


def test_a_data_root_that_does_not_exist_is_an_error_not_filled(cli: CliRunner, workdir: Path) -> None:
    """--system local makes synthetic data, but only in the cache or in an existing empty folder."""
    absent = workdir / "nope" / "energon"
    args = ["submit", "--system", "local", "--set", f"paths.data_root={absent}"]
    line = error_line(cli.invoke(app, args))
    assert line.startswith(f"error: paths.data_root: {absent} does not exist")
    assert not (workdir / "nope").exists() and not (workdir / "runs").exists()
    assert error_line(cli.invoke(app, [*args, "--dry-run"])) == line  # its script would fail the same way

    busy = workdir / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine\n")
    line = error_line(cli.invoke(app, ["submit", "--system", "local", "--set", f"paths.data_root={busy}"]))
    assert "holds files but no Energon dataset" in line
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]


def test_synthetic_data_goes_only_where_it_may(tmp_path: Path) -> None:
    from flux_cluster.config.training import SyntheticDataConfig
    from flux_cluster.data.prep.ensure import MARK_FILE, SPEC_FILE, check_synthetic_root
    from flux_cluster.errors import FluxClusterError

    spec = SyntheticDataConfig(train=64, val=16)
    check_synthetic_root(spec, tmp_path)  # empty: fine
    (tmp_path / MARK_FILE).write_text(json.dumps(spec.model_dump()))
    check_synthetic_root(spec, tmp_path)  # being filled with this spec: resumes
    other = SyntheticDataConfig(train=128, val=16)
    with pytest.raises(FluxClusterError, match=r"other train\.synthetic_data settings"):
        check_synthetic_root(other, tmp_path)
    (tmp_path / MARK_FILE).unlink()
    (tmp_path / SPEC_FILE).write_text("{}")
    (tmp_path / ".nv-meta").mkdir()
    (tmp_path / ".nv-meta" / ".info.json").write_text("{}")
    with pytest.raises(FluxClusterError, match=r"other train\.synthetic_data settings"):
        check_synthetic_root(spec, tmp_path)
    (tmp_path / SPEC_FILE).unlink()
    check_synthetic_root(other, tmp_path)  # a prepared dataset that is not ours: used as it is
    with pytest.raises(FluxClusterError, match="is not a folder"):
        check_synthetic_root(spec, tmp_path / ".nv-meta" / ".info.json")


def test_synth_force_never_replaces_data_it_did_not_make(cli: CliRunner, workdir: Path) -> None:
    real = workdir / "src" / "cc12m_preprocessed"
    real.mkdir(parents=True)
    (real / "data-00000-of-00001.arrow").write_text("a real download\n")
    line = one_line_error(cli.invoke(app, ["data", "synth", str(workdir / "src"), "--force"]))
    assert "no flux-synthetic.json, so not synthetic data" in line
    assert [p.name for p in real.iterdir()] == ["data-00000-of-00001.arrow"]


def test_help_and_tables_keep_colon_codes(cli: CliRunner, workdir: Path) -> None:
    """rich reads ':1234:' as an emoji code; the CLI's help and tables must print it as typed."""
    help_text = cli.invoke(app, ["submit", "--help"], env={"COLUMNS": "200"}).output
    assert "afterany:1234:1235" in help_text and "\U0001f522" not in help_text
    (workdir / "site.yaml").write_text("extends: local\ndescription: 'waits for afterany:1234:1235'\n")
    shown = cli.invoke(app, ["systems", "show", "site.yaml"])
    assert shown.exit_code == 0 and "afterany:1234:1235" in shown.output, shown.output


def test_piped_tables_keep_every_value_whole(cli: CliRunner, workdir: Path) -> None:
    """Not a terminal (| grep): rows are not cut at 80 columns, values are not wrapped or elided."""
    listing = cli.invoke(app, ["systems", "list"], env={"COLUMNS": "80"})
    row = next(line for line in listing.output.splitlines() if "gb200_nvl72" in line)
    assert "18 compute trays x 4 B200 (Grace-Blackwell), Pyxis" in row and "…" not in listing.output
    shown = cli.invoke(app, ["systems", "show", "local"], env={"COLUMNS": "80"})
    (row,) = [line for line in shown.output.splitlines() if "train.synthetic_data.train" in line]
    assert "configs/systems/local.yaml" in row and "…" not in shown.output


def test_logs_of_a_run_never_submitted_say_so_and_exit(cli: CliRunner, workdir: Path) -> None:
    assert cli.invoke(app, ["submit", "--system", "dgx_h100x8", "--dry-run"]).exit_code == 0
    for follow in ([], ["--follow"]):
        done = subprocess.run(
            [sys.executable, "-m", "flux_cluster", "logs", *follow],
            capture_output=True,
            text=True,
            timeout=60,  # it used to wait forever
        )
        assert "never submitted (prepared with --dry-run)" in one_line_error(done)


def test_logs_of_an_array_run_name_the_task_of_every_line(cli: CliRunner, workdir: Path) -> None:
    from flux_cluster.launch import slurm

    assert cli.invoke(app, ["submit", "--system", "local_slurm", "--dry-run", "--nexp", "2"]).exit_code == 0
    (run_dir,) = list_runs(workdir / "runs")
    ids = ["77_0", "77_1"]
    RunRecord(launcher="slurm", job_ids=ids, submitted_at=0.0, array=True).save(run_dir)
    for job_id, text in zip(ids, ["a\nb\n", "c\nunfinished"], strict=True):
        slurm.log_path(job_id, run_dir / "slurm").write_text(text)
    result = cli.invoke(app, ["logs"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["[task 0] a", "[task 0] b", "[task 1] c", "[task 1] unfinished"]
    one = cli.invoke(app, ["logs", "--task", "1"])
    assert one.output == "c\nunfinished"


def test_a_data_job_says_what_it_does_on_stdout(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A convert array task is 'convert task 2 of 2' (not a repeat with a seed), and its progress is job
    output (stdout, like every other job's); stderr stays for errors."""
    from flux_cluster.config import load_system
    from flux_cluster.data.prep.synthetic import synthesize
    from flux_cluster.jobs.data import main as data_job
    from flux_cluster.jobs.data import task_title
    from flux_cluster.launch.data_jobs import data_job_plan
    from flux_cluster.launch.render import render_script
    from flux_cluster.launch.submit import prepare_run_dir
    from flux_cluster.rundir import create_run_dir

    assert task_title("convert", 1, 2) == "convert task 2 of 2" and task_title("index", 0, 1) == "index"
    synthesize(workdir / "src", train=16, val=8, dims="tiny", seed=0)
    capsys.readouterr()
    sets = [
        f"paths.source_root={workdir / 'src'}",
        f"paths.data_root={workdir / 'out'}",
        "data_prep.shard_size=8",
    ]
    system = load_system("local_slurm", sets).config
    run_dir = create_run_dir(workdir / "runs", "prepare-data", "local_slurm-convert")
    plan = data_job_plan(system, "convert", run_dir, "prepare-data", None)
    prepare_run_dir(plan, render_script(plan))
    monkeypatch.setenv("FLUX_EXP_INDEX", "1")
    assert data_job(["--config", str(run_dir / "config.yaml"), "--stage", "convert"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"[data] convert task 2 of 2: {workdir / 'src'} -> {workdir / 'out'}\n")
    assert "convert (task 2/2): 16/16 samples" in out and err == ""


# ---- logs, status and failed submits (issues 27 and 31)


def _finished_local_run(cli: CliRunner, workdir: Path, log: bytes) -> Path:
    assert cli.invoke(app, ["submit", "--system", "local", "--dry-run"]).exit_code == 0
    (run_dir,) = list_runs(workdir / "runs")
    RunRecord(launcher="local", job_ids=[], submitted_at=0.0, pid=None, exit_code=0).save(run_dir)
    (run_dir / "slurm" / "local.log").write_bytes(log)
    return run_dir


def test_logs_read_only_regular_files_inside_the_run_folder(cli: CliRunner, workdir: Path) -> None:
    run_dir = _finished_local_run(cli, workdir, b"one\ntwo\nthree\n")
    assert cli.invoke(app, ["logs"]).output == "one\ntwo\nthree\n"
    assert cli.invoke(app, ["logs", "--tail", "2"]).output == "two\nthree\n"
    secret = workdir / "secret.txt"
    secret.write_text("outside the run folder\n")
    log = run_dir / "slurm" / "local.log"
    log.unlink()
    log.symlink_to(secret)
    line = error_line(cli.invoke(app, ["logs"]))
    assert "local.log: a symbolic link; refused" in line and "outside the run" not in line
    log.unlink()
    (run_dir / "slurm").rmdir()
    (run_dir / "slurm").symlink_to(workdir)  # the log folder itself leads out
    (workdir / "local.log").write_text("outside the run folder\n")
    assert "refused" in error_line(cli.invoke(app, ["logs"]))


def test_logs_stream_a_big_log_in_flat_memory(tmp_path: Path) -> None:
    import tracemalloc

    from flux_cluster.launch.track import copy_log

    log = tmp_path / "job.log"
    with log.open("wb") as out:
        for _ in range(48):
            out.write((b"x" * 1023 + b"\n") * 1024)  # 48 MiB
    written = 0

    def discard(text: str) -> None:
        nonlocal written
        written += len(text)

    tracemalloc.start()
    try:
        offset = copy_log(log, tmp_path, 0, discard)
        tail_offset = copy_log(log, tmp_path, 0, discard, tail=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert offset == tail_offset == 48 * 1024 * 1024 and written == offset + 10 * 1024
    assert peak < 24 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB for a 48 MiB log"


def test_logs_stderr_of_a_local_run_and_status_of_a_dry_run_say_what_they_are(
    cli: CliRunner, workdir: Path
) -> None:
    assert cli.invoke(app, ["submit", "--system", "local", "--dry-run"]).exit_code == 0
    status = cli.invoke(app, ["status"], env={"COLUMNS": "300"})
    assert status.exit_code == 0 and "None" not in status.output, status.output
    assert "a dry run (--dry-run)" in status.output and "'bash job.sh'" in status.output
    assert "NOT SUBMITTED" in status.output
    (run_dir,) = list_runs(workdir / "runs")
    RunRecord(launcher="local", job_ids=[], submitted_at=0.0, pid=None, exit_code=0).save(run_dir)
    (run_dir / "slurm" / "local.log").write_text("stdout and stderr\n")
    line = error_line(cli.invoke(app, ["logs", "--stderr"]))
    assert "stdout and stderr together" in line and "drop --stderr" in line


def test_status_and_runs_list_escape_control_characters(cli: CliRunner, workdir: Path) -> None:
    run_dir = _finished_local_run(cli, workdir, b"")
    hostile = run_dir.parent / "20990101-000000-x\x1b]0;pwned\x07"
    run_dir.rename(hostile)
    for command in (["status"], ["runs", "list"]):
        result = cli.invoke(app, command, env={"COLUMNS": "300"})
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.output and "\x07" not in result.output
        assert "\\x1b]0;pwned\\x07" in result.output


def test_a_submit_that_never_started_leaves_no_run_folder(
    cli: CliRunner, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = workdir / "tools"
    tools.mkdir()
    (tools / "sbatch").write_text(
        "#!/bin/bash\n"
        "echo 'sbatch: error: Batch job submission failed: Unable to contact slurm controller' >&2\n"
        "exit 1\n"
    )
    (tools / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{sys.exec_prefix}/bin:/usr/bin:/bin")
    assert (
        cli.invoke(app, ["submit", "--system", "local_slurm", "--job", "preflight", "--dry-run"]).exit_code
        == 0
    )
    (prepared,) = list_runs(workdir / "runs")
    # an old never-started folder (from before this fix) is not the latest either
    stale = prepared.parent / "20990101-000000-stale"
    stale.mkdir()
    (stale / "config.yaml").write_text((prepared / "config.yaml").read_text())
    line = error_line(cli.invoke(app, ["submit", "--system", "local_slurm", "--job", "preflight"]))
    assert "Unable to contact slurm controller" in line and "nothing started: removed its run folder" in line
    assert list_runs(workdir / "runs") == [prepared, stale]
    status = cli.invoke(app, ["status"], env={"COLUMNS": "300"})
    assert status.exit_code == 0 and prepared.name in status.output, status.output


def _help_pages(cli: CliRunner) -> dict[str, str]:
    """Every command's help at 80 columns, by command path."""
    import typer

    pages = {}

    def walk(command: Any, path: list[str]) -> None:
        pages[" ".join(path)] = cli.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}).output
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return pages


def test_help_is_shown_as_typed_at_80_columns(cli: CliRunner) -> None:
    """No markup eats '[task 3]', a flag shows no '<bool>', a choice list never breaks mid-word (its
    choices are in the help text), a long default is never cut."""
    pages = _help_pages(cli)
    assert "[task 3]" in pages["logs"] and "[task 3]" in pages["runs logs"]
    for path, page in pages.items():
        for shown in ("<bool>", "<int", "<str>", "<path>", "<list", "\u2026"):
            assert shown not in page, (path, shown, page)
    report = pages["report"]
    assert "FORMAT" in report and "One of: table, json, csv," in report and "html" in report
    assert "|h" not in report and "tml>" not in report
    assert "runs/evaluate/TIME-NAME/eval" in pages["evaluate"]
