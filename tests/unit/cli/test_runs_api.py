"""runs list / status / logs / cancel go through flux_cluster.api like every other group: the CLI module
parses, calls the API and prints; the API gives the same answers to Python."""

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flux_cluster import api
from flux_cluster.cli import app
from flux_cluster.errors import FluxClusterError
from flux_cluster.rundir import RunRecord, list_runs

CLI_RUNS = Path(__file__).parents[3] / "flux_cluster" / "cli" / "runs.py"


def test_the_runs_commands_import_nothing_of_the_package_but_the_api() -> None:
    imported = set()
    for node in ast.walk(ast.parse(CLI_RUNS.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flux_cluster"):
            imported |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names if alias.name.startswith("flux_cluster")}
    printing = {"flux_cluster.safe_text.plain", "flux_cluster.cli.console.Typer"}
    printing |= {"flux_cluster.cli.console.cli_console", "flux_cluster.cli.console.print_table"}
    printing |= {"flux_cluster.cli.options.RunArgument", "flux_cluster.cli.options.RunsDirOption"}
    assert imported - printing == {"flux_cluster.api"}


def _runs(cli: CliRunner, workdir: Path) -> tuple[Path, Path]:
    """A dry run, and a local run that finished with a log."""
    for _ in range(2):
        assert cli.invoke(app, ["submit", "--system", "local", "--dry-run"]).exit_code == 0
    prepared, finished = list_runs(workdir / "runs")
    RunRecord(launcher="local", job_ids=[], submitted_at=0.0, pid=None, exit_code=0).save(finished)
    (finished / "slurm" / "local.log").write_bytes(b"one\ntwo\nthree\n")
    return prepared, finished


def test_the_api_lists_opens_and_follows_runs_as_the_cli_shows_them(cli: CliRunner, workdir: Path) -> None:
    prepared, finished = _runs(cli, workdir)
    damaged = prepared.parent / "20990101-000000-damaged"
    damaged.mkdir()
    (damaged / "config.yaml").write_text("system: [")
    listing = api.list_runs()
    assert [row.run for row in listing.rows] == [f"flux1/{p.name}" for p in (prepared, finished)]
    assert [(row.launcher, row.state) for row in listing.rows] == [
        ("dry-run", "NOT SUBMITTED"),
        ("local", "COMPLETED"),
    ]
    assert len(listing.skipped) == 1 and listing.skipped[0].startswith(f"skipped flux1/{damaged.name}: ")

    dry = api.open_run(str(prepared))
    assert dry.launcher == "dry-run" and [job.state for job in dry.jobs()] == ["NOT SUBMITTED"]
    assert "run it with 'bash job.sh' in the run folder" in (dry.dry_run_note() or "")
    with pytest.raises(FluxClusterError, match="never submitted"):
        dry.logs()

    done = api.open_run()  # the latest started
    assert done.run_dir == finished.absolute() and done.dry_run_note() is None
    assert [(job.job, job.state) for job in done.jobs()] == [("-", "COMPLETED")]
    lines: list[str] = []
    done.follow_logs(lines.append, tail=2)
    assert "".join(lines) == "two\nthree\n" == cli.invoke(app, ["logs", "--tail", "2"]).output
    assert done.logs() == "one\ntwo\nthree\n"
    status = cli.invoke(app, ["status"], env={"COLUMNS": "200"})
    assert status.exit_code == 0 and "COMPLETED" in status.output


def test_run_logs_read_only_regular_files_inside_the_run_folder(cli: CliRunner, workdir: Path) -> None:
    """As `logs` does: Run.logs() of a log linked out of its folder is one line, not the file it links to."""
    _, finished = _runs(cli, workdir)
    secret = workdir / "secret.txt"
    secret.write_text("outside the run folder\n")
    log = finished / "slurm" / "local.log"
    log.unlink()
    log.symlink_to(secret)
    with pytest.raises(FluxClusterError, match=r"local\.log: a symbolic link; refused"):
        api.open_run().logs()
