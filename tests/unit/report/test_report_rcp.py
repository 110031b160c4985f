"""The RCP checker's verdict in the report (issue 40, item 2) and the ruleset of a 6.0 round's logs
(issue 39, also found): what mlperf_logging's own rcp_checker and compliance checker say."""

import csv
import io
import json
import re
from pathlib import Path

import pytest
from report_samples import sample
from test_report_output import _submission
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.report.build import Options, build
from flux_cluster.report.compliance import check_log
from flux_cluster.report.rcp import reference, verdict

__all__ = ["sample"]

AMD_V60_KEYS = {
    "tensor_parallelism": 1, "pipeline_parallelism": 1, "context_parallelism": 1, "expert_parallelism": 1,
    "micro_batch_size": 32, "config_filename": "config_MI325X_08x08x32.sh",
    "lowest_numerical_precision_in_linear": "fp8",
}  # fmt: skip
"""What AMD's v6.0 flux1 logs (MI325X, 8x8) disclose: some of 6.1.0's keys, not its attn/comm precisions."""


def _line(key: str, value: object) -> bytes:
    event = {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": key, "value": value}
    return (
        ":::MLLOG " + json.dumps(event | {"metadata": {"file": "logging.py", "lineno": 1}}) + "\n"
    ).encode()


def _v60_shaped(sample: Path, root: Path) -> Path:
    """The real v5.1 logs with the disclosure keys AMD's v6.0 logs carry, after opt_gradient_clip_norm."""
    group = _submission(sample, root, runs=10)
    for log in group.glob("result_*.txt"):
        lines = log.read_bytes().splitlines(keepends=True)
        at = next(i for i, line in enumerate(lines) if b'"opt_gradient_clip_norm"' in line)
        extra = [_line(key, value) for key, value in AMD_V60_KEYS.items()]
        log.write_bytes(b"".join([*lines[: at + 1], *extra, *lines[at + 1 :]]))
    return group


def test_a_v60_round_log_is_checked_under_600_not_610(sample: Path, tmp_path: Path) -> None:
    group_dir = _v60_shaped(sample, tmp_path / "amd")
    (group,) = build([tmp_path / "amd"], Options(check=False))
    assert (group.ruleset, group.ruleset_from) == ("6.0.0", "logs")
    assert any("lowest_numerical_precision_in_attn" in w and "--ruleset" in w for w in group.warnings)
    log = group_dir / "result_0.txt"
    assert check_log(log, group.ruleset)[0]  # the official checker passes it under the chosen ruleset
    passed, messages = check_log(log, "6.1.0")  # ... and fails it under 6.1.0: every run would drop
    assert not passed and any("lowest_numerical_precision_in_comm" in m for m in messages)
    (forced,) = build([tmp_path / "amd"], Options(check=False, ruleset="6.1.0"))
    assert (forced.ruleset, forced.ruleset_from) == ("6.1.0", "--ruleset")


def test_the_rcp_verdict_is_the_checkers_in_every_format(sample: Path, tmp_path: Path) -> None:
    cli = CliRunner()
    out = cli.invoke(app, ["report", str(sample), "--no-check", "--ruleset", "5.1.0", "-f", "json"])
    (group,) = json.loads(out.stdout)["groups"]
    ref = reference("5.1.0", 512)
    assert group["rcp"]["verdict"] == "pass" and group["rcp"]["factor"] == 1.0
    assert group["rcp"]["rcp_mean"] == pytest.approx(ref.mean) and ref.kind == "found"
    assert group["rcp"]["mean_samples"] == group["samples_to_converge"] == 8_388_608
    rows = list(
        csv.DictReader(
            io.StringIO(cli.invoke(app, ["report", str(sample), "--no-check", "-f", "csv"]).stdout)
        )
    )
    assert rows[0]["rcp_verdict"] == "pass"
    table = cli.invoke(app, ["report", str(sample), "--no-check"]).stdout
    assert "RCP" in table and " pass " in table
    markdown = cli.invoke(app, ["report", str(sample), "--no-check", "-f", "md"]).stdout
    assert "| RCP |" in markdown and "| pass |" in markdown

    few = _submission(sample, tmp_path / "few", runs=4)
    (group_few,) = build([few], Options(check=False, ruleset="5.1.0"))
    assert group_few.rcp is not None and group_few.rcp["too_few_runs"]
    assert group_few.rcp_verdict is not None and group_few.rcp_verdict.endswith("(4 of 10 runs)")


def test_verdicts_follow_the_checkers_statistics() -> None:
    ref = reference("5.1.0", 512)
    fast = [ref.mean * 0.99] * 10  # faster than the RCP mean, within its tolerance: normalized
    result = verdict("5.1.0", "flux1", 512, fast)
    assert result["verdict"] == "pass, normalized" and result["factor"] == pytest.approx(1 / 0.99)
    too_fast = [ref.min_mean * 0.99] * 10
    assert verdict("5.1.0", "flux1", 512, too_fast)["verdict"] == "fail"
    two_unconverged = [None, None] + [ref.mean] * 8
    assert verdict("5.1.0", "flux1", 512, two_unconverged)["verdict"] == "insufficient convergence"
    assert verdict("5.1.0", "flux1", 8192, [ref.mean] * 10)["verdict"] == "missing RCP"
    between = reference("5.1.0", 2304)  # interpolated as the checker does: mean and stdev linearly
    low, high = reference("5.1.0", 2048), reference("5.1.0", 4096)
    assert between.kind == "interpolated"
    assert between.mean == pytest.approx(low.mean + (high.mean - low.mean) * 256 / 2048)
    assert reference("6.0.0", 1024).kind == "interpolated"  # 6.0.0's 1024 point is pruned


def _edited(sample: Path, root: Path, batch: int, samples_times: float = 1.0) -> Path:
    """The sample's ten runs at another global batch, every samples_count scaled."""
    group = _submission(sample, root, runs=10)
    for log in group.glob("result_*.txt"):
        text = log.read_text().replace(
            '"key": "global_batch_size", "value": 512', f'"key": "global_batch_size", "value": {batch}'
        )
        text = re.sub(
            r'"samples_count": (\d+)', lambda m: f'"samples_count": {int(int(m[1]) * samples_times)}', text
        )
        log.write_text(text)
    return group


@pytest.mark.parametrize(
    ("batch", "times", "word"),
    [
        (512, 1.0, "pass"),  # its RCP found
        (2304, 1.0, "fail"),  # interpolated, far faster than it
        (256, 1.0, "pass"),  # below the smallest RCP, slower than it: the checker passes it
        (256, 0.5, "missing RCP"),  # below the smallest and faster: the checker asks for an RCP
        (8192, 1.0, "missing RCP"),  # above every RCP
    ],
)
def test_the_verdict_is_what_check_directory_says_of_the_same_folder(
    sample: Path, tmp_path: Path, batch: int, times: float, word: str
) -> None:
    from mlperf_logging.rcp_checker import rcp_checker

    folder = _edited(sample, tmp_path / "runs", batch, times)
    (group,) = build([tmp_path / "runs"], Options(check=False, ruleset="5.1.0"))
    assert group.rcp is not None
    passed, message, factor = rcp_checker.check_directory(
        str(folder), "training", "5.1.0", False, False, rcp_pass="pruned_rcps"
    )
    assert (group.rcp["verdict"], group.rcp["message"]) == (word, message)
    assert passed == (word not in ("fail", "missing RCP"))
    assert group.rcp.get("factor", 1.0) == pytest.approx(factor)
