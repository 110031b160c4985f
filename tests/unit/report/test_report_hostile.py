"""flux-cluster report on hostile results folders: nothing runs, nothing blows up, every medium escaped."""

import csv
import io
import json
import re
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from report_samples import GROUP, sample
from rich.console import Console
from typer.testing import CliRunner

from flux_cluster import mlperf_rules
from flux_cluster.cli import app
from flux_cluster.jobs.compliance import compliance_verdict
from flux_cluster.report import compliance
from flux_cluster.report.discover import find_inputs
from flux_cluster.report.formats import print_tables, render_csv, render_markdown
from flux_cluster.report.harvest import RunResult, harvest_run
from flux_cluster.report.scoring import GroupResult
from flux_cluster.safe_text import printable

__all__ = ["sample"]  # report_samples' fixture (the real v5.1 logs, unpacked once), used here too

HOSTILE = (
    '<script>alert(1)</script>|=HYPERLINK("http://x")\x1b[2J\x1b]8;;http://evil\x1b\\[link=http://evil]x'
)


T = TypeVar("T")


def _log(sample: Path, index: int = 0) -> bytes:
    return (sample / GROUP / f"result_{index}.txt").read_bytes()


def _set(log: bytes, key: str, value: object) -> bytes:
    """The log with `key` (a POINT_IN_TIME key logged once, or added next to submission_org) set to value."""
    lines = log.splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if f'"key": "{key}"'.encode() in line]
    at = found[0] if found else next(i for i, line in enumerate(lines) if b'"submission_org"' in line)
    event = json.loads(lines[at].removeprefix(b":::MLLOG "))
    line = b":::MLLOG " + json.dumps({**event, "key": key, "value": value}).encode() + b"\n"
    lines[at : at + bool(found)] = [line]
    return b"".join(lines)


def test_the_checker_never_loads_rules_a_log_names(sample: Path, tmp_path: Path, cli: CliRunner) -> None:
    # the official checker exec()s the CODE of '{division}_common.yaml': a crafted division would run ours
    marker = tmp_path / "MARKER"
    (tmp_path / "evil_common.yaml").write_text(f"- BEGIN:\n    CODE: \"open('{marker}', 'w').write('x')\"\n")
    escape = "/.." * 30 + str(tmp_path / "evil")
    group = tmp_path / "org" / "results" / "sys" / "flux1"
    group.mkdir(parents=True)
    (group / "result_0.txt").write_bytes(_log(sample, 0))
    (group / "result_1.txt").write_bytes(_set(_log(sample, 1), "submission_division", escape))
    result = cli.invoke(app, ["report", str(tmp_path / "org"), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert not marker.exists(), "the report ran code from the folder it reported"
    runs = json.loads(result.stdout)["groups"][0]["runs"]
    assert [r["compliance"] for r in runs] == ["passed", "failed"]
    assert runs[1]["compliance_messages"] == [
        f"submission_division: got {escape!r}, expected one of closed, open"
    ]
    assert runs[0]["scored"] and runs[1]["minutes"]  # both still reported


def test_the_checker_loads_only_the_packages_rules_files(
    sample: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the second wall: with the value allowlist switched off, the rules-file guard still refuses
    marker = tmp_path / "MARKER"
    (tmp_path / "evil_common.yaml").write_text(f"- BEGIN:\n    CODE: \"open('{marker}', 'w').write('x')\"\n")
    log = tmp_path / "result_0.txt"
    log.write_bytes(_set(_log(sample), "submission_division", "/.." * 30 + str(tmp_path / "evil")))
    benchmark = tmp_path / "result_1.txt"
    benchmark.write_bytes(_set(_log(sample, 1), "submission_benchmark", "flux1/../../x"))
    passed, messages = compliance.check_log(benchmark, "6.1.0")
    assert not passed and messages[0].startswith("submission_benchmark: got 'flux1/../../x', expected one")
    wrong = "ruleset '../5.1.0' is not one of 5.1.0, 6.0.0, 6.1.0"
    assert compliance.check_log(log, "../5.1.0") == (False, [wrong])
    monkeypatch.setattr(compliance, "refused_values", lambda loglines, ruleset: [])
    passed, messages = compliance.check_log(log, "5.1.0")
    assert not marker.exists() and not passed
    assert any(m.startswith("refused rules file 'training_5.1.0//../") for m in messages), messages


def _hostile_group() -> GroupResult:
    run = RunResult(file=f"/r/result_{HOSTILE}.txt", status=HOSTILE, warnings=[HOSTILE])
    return GroupResult(
        path=f"/r/{HOSTILE}",
        benchmark=HOSTILE,
        system=HOSTILE,
        submitter="+cmd|' /C calc'!A0",
        accelerator_model="@SUM(1+1)",
        accelerators=8,
        ruleset="\t=1+1",
        runs=[run],
        warnings=[HOSTILE],
    )


def test_markdown_and_csv_carry_no_html_formulas_or_control_characters() -> None:
    group = _hostile_group()
    markdown = render_markdown([group])
    for raw in ("<script", "\x1b", "[link=", '"http'):
        assert raw not in markdown, raw
    assert "&lt;script&gt;" in markdown
    table_rows = [line for line in markdown.splitlines() if line.startswith("|")]
    assert {line.count("|") for line in table_rows} == {15, 20}  # a pipe in a cell splits no cell
    assert f"`/r/{HOSTILE[:20]}" not in markdown  # the path is no code span to break out of

    text = render_csv([group])
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f\u202e]", text), repr(text)  # cat report.csv: no ESC
    (row,) = csv.DictReader(io.StringIO(text))
    assert row["system"] == printable(HOSTILE) and "\\x1b[2J" in row["system"]  # '<': no formula
    assert row["submitter"] == "'+cmd|' /C calc'!A0"
    assert row["accelerator_model"] == "'@SUM(1+1)" and row["ruleset"] == "'\\x09=1+1"
    assert row["path"] == f"/r/{printable(HOSTILE)}" and row["accelerators"] == "8"  # the rest as it was
    minus = GroupResult(**{**group.__dict__, "system": "-2+3", "path": "=1", "runs": []})
    (row,) = csv.DictReader(io.StringIO(render_csv([minus])))
    assert row["system"] == "'-2+3" and row["path"] == "'=1"


def test_terminal_tables_show_hostile_text_as_text() -> None:
    out = io.StringIO()
    print_tables([_hostile_group()], Console(file=out, width=400, force_terminal=True), checked=False)
    text = out.getvalue()
    assert "\x1b[2J" not in text and "\x1b]8;;http://evil" not in text, repr(text)
    assert "\\x1b[2J" in text and "[link=http://evil]x" in text  # shown, visibly


def test_systems_list_shows_descriptions_as_text(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "evil.yaml").write_text(
        'extends: local\ndescription: "[link=http://evil]click[/link] \\e[2J \\e]8;;http://evil\\e\\\\ end"\n'
        'gpu_model: "[bold]cpu[/bold]"\n'
    )
    (tmp_path / "broken.yaml").write_text('extends: local\nnodes: "[red]\\e[2J"\n')
    monkeypatch.setenv("FLUX_CLUSTER_SYSTEMS", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "400")
    result = cli.invoke(app, ["systems", "list"])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output, repr(result.output)
    assert "[link=http://evil]click[/link] \\x1b[2J" in result.output and "[bold]cpu[/bold]" in result.output
    assert "broken" in result.output and "[red]" in result.output


def _peak(function: Callable[..., T], *args: object) -> tuple[T, int]:
    tracemalloc.start()
    try:
        value = function(*args)
        return value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_stays_bounded_on_hostile_logs(
    tmp_path: Path, sample: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = 4 << 20
    returns = tmp_path / "returns.txt"  # a \r storm: one 'line' to Python's binary readline
    returns.write_bytes(b"\r" * size)
    nuls = tmp_path / "nuls.txt"  # a crash's NUL fill, no newline
    nuls.write_bytes(b":::MLLOG " + b"\0" * size)
    run, peak = _peak(harvest_run, returns)
    assert peak < 2e6, f"{peak / 1e6:.1f} MB"
    assert run.warnings == ["no :::MLLOG lines", "no run_start"]
    run, peak = _peak(harvest_run, nuls)
    assert peak < 2e6, f"{peak / 1e6:.1f} MB"
    assert run.longest_line == size + 9 and any("over 256 KiB skipped" in w for w in run.warnings)

    # the same lines whatever the chunking: each line end (\n, \r\n, \r) anywhere in a chunk
    original = harvest_run(sample / GROUP / "result_0.txt")
    mixed = tmp_path / "mixed.txt"
    mixed.write_bytes(_log(sample).replace(b"\n", b"\r\n", 40).replace(b"\n", b"\r", 40)[:-100])
    for chunk in (7, 4096):
        monkeypatch.setattr(mlperf_rules, "CHUNK_BYTES", chunk)  # bounded_lines reads in these
        again = harvest_run(sample / GROUP / "result_0.txt")
        odd = harvest_run(mixed)
        assert again == original, chunk
        assert odd.eval_curve == original.eval_curve[: len(odd.eval_curve)] and odd.status == "incomplete"


def test_a_yaml_alias_bomb_in_a_run_config_is_refused(sample: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "results").mkdir(parents=True)
    (run_dir / "results" / "result_0.txt").write_bytes(_log(sample))
    bomb = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [f"{c}: &{c} [{', '.join(['*' + p] * 10)}]" for p, c in zip("abcde", "bcdef", strict=True)]
    (run_dir / "config.yaml").write_text(
        "\n".join(bomb) + "\nsystem: {name: *f, nodes: 1, gpus_per_node: 8}\n"
    )
    ((group,), _), peak = _peak(find_inputs, [run_dir])
    assert peak < 4e6, f"{peak / 1e6:.1f} MB"
    assert group.system is None and group.accelerators is None
    (warning,) = group.warnings  # the words are the config loader's
    assert warning.startswith(f"{run_dir / 'config.yaml'}: unreadable run config (") and "aliases" in warning


def test_out_of_range_numbers_are_one_line_each_never_a_crash(
    sample: Path, tmp_path: Path, cli: CliRunner
) -> None:
    good = tmp_path / "org" / "results" / "good" / "flux1"
    bad = tmp_path / "org" / "results" / "bad" / "flux1"
    for group in (good, bad):
        group.mkdir(parents=True)
        for i in range(3):
            (group / f"result_{i}.txt").write_bytes(_log(sample, i))
    systems = tmp_path / "org" / "systems"
    systems.mkdir()
    description = json.loads((sample / "NVIDIA" / "systems" / "tyche_ngpu16_ngc25.09_nemo.json").read_text())
    (systems / "good.json").write_text(json.dumps(description))
    (systems / "bad.json").write_text(
        json.dumps({**description, "accelerators_per_node": "4.5"}).replace('"4"', "1e308")
    )
    (bad / "result_1.txt").write_bytes(_set(_log(sample, 1), "number_of_nodes", 1e308))
    huge = _log(sample, 2).replace(b'"samples_count": 262144,', b'"samples_count": 1e308,')
    lines = huge.splitlines(keepends=True)  # and a time past float range on a line the report reads
    seed = next(i for i, line in enumerate(lines) if b'"key": "seed"' in line)
    lines[seed] = lines[seed].replace(b'"time_ms": ', b'"time_ms": 1' + b"0" * 400)
    (bad / "result_2.txt").write_bytes(b"".join(lines))
    for fmt in ("table", "csv", "md", "json"):
        result = cli.invoke(app, ["report", str(tmp_path / "org"), "--no-check", "--format", fmt])
        assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    document = json.loads(result.stdout)  # the last format: json
    bad_group, good_group = document["groups"]
    expected = "expected a whole number from 1 to 1,000,000"
    assert bad_group["warnings"][:2] == [
        f"{systems / 'bad.json'}: number_of_nodes: got 1e+308, {expected}",
        f"{systems / 'bad.json'}: accelerators_per_node: got '4.5', {expected}",
    ]
    assert f"number_of_nodes: got 1e+308, {expected}" in bad_group["runs"][1]["warnings"]
    assert bad_group["accelerators"] is None and bad_group["runs"][0]["status"] == "success"
    assert any("1 malformed" in w for w in bad_group["runs"][2]["warnings"]), bad_group["runs"][2]["warnings"]
    assert "block_start/block_stop without samples_count: no throughput" in bad_group["runs"][2]["warnings"]
    assert good_group["accelerators"] == 16 and good_group["olympic_minutes"]
    assert "give --ruleset" in good_group["warnings"][0]  # no vX.Y in the path, no 6.1.0 key in the logs
    assert good_group["warnings"][1:] == ["3 of the 10 runs a flux1 submission needs"]


def test_the_checker_reads_a_big_log_in_flat_memory_and_fast(sample: Path, tmp_path: Path) -> None:
    """Only :::MLLOG lines reach the official parser, streamed; an over-long one is counted and dropped;
    a 60 KB MLLOG line (quadratic in the parser's own regex: seconds each) costs nothing."""
    log = _log(sample)
    body = log.index(b"\n", log.index(b'"run_start"')) + 1
    stats = next(line for line in log.splitlines(keepends=True) if b'"tracked_stats"' in line)
    noisy = stats.replace(b'"metadata": {', b'"metadata": {"pad": "' + b"x" * 60_000 + b'", ', 1)
    big = tmp_path / "big.txt"
    with big.open("wb") as out:
        out.write(log[:body])
        out.write(b"garbage that is no MLLOG line\n" * 700_000)  # ~21 MB the parser never sees
        out.write(noisy * 20)  # each took the official parser 2 s of CPU
        out.write(b":::MLLOG " + b"\0" * (1 << 20) + b"\n")  # a crash's NUL fill: dropped
        out.write(log[body:])
    started = time.monotonic()
    (passed, messages), peak = _peak(compliance.check_log, big, "5.1.0")
    assert time.monotonic() - started < 20 and peak < 40e6, f"{peak / 1e6:.1f} MB"
    assert messages[-1] == "1 :::MLLOG line(s) over 256 KiB not given to the checker", messages
    assert (passed, messages[:-1]) == compliance.check_log(sample / GROUP / "result_0.txt", "5.1.0")
    started = time.monotonic()  # the job's compliance step reads it the same way
    line, code = compliance_verdict(big, "5.1.0", tmp_path / "checker.log")
    assert (line, code) == ("big.txt passed the MLPerf 5.1.0 compliance check", 0)
    assert time.monotonic() - started < 20


def test_a_check_past_its_deadline_is_that_runs_verdict(sample: Path, tmp_path: Path, cli: CliRunner) -> None:
    log = sample / GROUP / "result_0.txt"
    (verdict,) = compliance.check_logs([(log, "5.1.0")], timeout=0.01)
    assert verdict == (0, False, ["compliance check timed out after 0.01 s"])
    result = cli.invoke(
        app, ["report", str(log), "--check-timeout", "0.01", "--ruleset", "5.1.0", "-f", "json"]
    )
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)["groups"][0]["runs"]
    assert run["compliance"] == "failed" and run["compliance_messages"] == [
        "compliance check timed out after 0.01 s"
    ]


# Folder names (no '/'), a system name, an evaluation's model, device and caption: every medium gets them.
RUN_NAME = '=HYPERLINK("x:evil")<script>alert(1)\x1b[2J\x07[bold]run'
ORG_NAME = "@org<script>x\x1b]0;title\x07"
CAPTION = "<img src=x onerror=alert(1)>\x1b[31m[link=http:evil]caption"


@pytest.fixture
def hostile_tree(sample: Path, tmp_path: Path) -> Path:
    """A fine-tuning run folder and an MLPerf submission's org folder named to attack each medium, with
    an evaluation whose model, device and caption (its NOT MEANINGFUL reason) are hostile too."""
    from test_report_eval import write_eval
    from test_report_finetune import fine_tuning_run

    run = fine_tuning_run(tmp_path / "tree" / RUN_NAME)
    write_eval(run, model="+cmd|' /C calc'!A0", device="-2+3", meaningful=False, meaningful_reason=CAPTION)
    group = tmp_path / "tree" / ORG_NAME / "results" / "sys" / "flux1"
    group.mkdir(parents=True)
    for i in range(3):
        (group / f"result_{i}.txt").write_bytes(_log(sample, i))
    return tmp_path / "tree"


def _terminal(tree: Path) -> str:
    from flux_cluster.report.build import Options, build

    out = io.StringIO()
    console = Console(file=out, width=120, color_system=None, force_terminal=True)
    print_tables(build([tree], Options(check=False)), console, checked=False)
    return out.getvalue()


def _csv_holds(text: str) -> list[str]:
    (_header, *rows) = csv.reader(io.StringIO(text))
    cells = [cell for row in rows for cell in row]
    formulas = [c for c in cells if c[:1] in ("=", "+", "-", "@") and not re.fullmatch(r"-?[\d.]+", c)]
    assert not formulas, formulas
    return cells


TEXT_MARKS = ["\\x1b[2J\\x07[bold]run", "\\x1b]0;title\\x07", "\\x1b[31m[link=http:evil]caption"]
"""Each hostile text as a terminal and a page show it: control characters spelled out, markup as text."""
HOSTILE_FORMATS: dict[str, tuple[list[str], list[str]]] = {
    # format: (what its output holds, what it never holds besides a raw control character)
    "terminal": (TEXT_MARKS, []),
    "table": (TEXT_MARKS, []),  # redirected: the CLI's
    "md": (
        [
            "&lt;script&gt;alert(1)&#92;x1b&#91;2J&#92;x07&#91;bold&#93;run",
            "@org&lt;script&gt;x&#92;x1b&#93;0;title&#92;x07",
            "NO: &lt;img src=x onerror=alert(1)&gt;&#92;x1b",
        ],
        ["<script", "<img"],
    ),
    "html": (
        [
            "&lt;script&gt;alert(1)\\x1b[2J\\x07[bold]run",
            "@org&lt;script&gt;x\\x1b]0;title\\x07",
            "&lt;img src=x onerror=alert(1)&gt;\\x1b[31m[link=http:evil]caption",
        ],
        ["<script", "<img src=x"],
    ),
    "csv": ([], ['"=HYPERLINK']),  # its cells: below
    "json": (['"=HYPERLINK(\\"x:evil\\")<script>alert(1)\\u001b[2J\\u0007[bold]run"'], []),  # data, exactly
}


@pytest.mark.parametrize("fmt", HOSTILE_FORMATS)
def test_hostile_names_and_captions_through_every_output_format(
    hostile_tree: Path, cli: CliRunner, fmt: str
) -> None:
    if fmt == "terminal":
        text = _terminal(hostile_tree)
    else:
        result = cli.invoke(app, ["report", str(hostile_tree), "--no-check", "--format", fmt])
        assert result.exit_code == 0, result.output
        text = result.stdout
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f]", text), repr(text)  # no ESC, BEL, ...
    present, absent = HOSTILE_FORMATS[fmt]
    assert [m for m in present if m not in text] == [] and [m for m in absent if m in text] == []
    if fmt == "csv":
        assert "'" + printable(RUN_NAME) in _csv_holds(text)  # the system column: the run folder's name
    if fmt == "json":
        groups = json.loads(text)["groups"]
        assert {g["system"] for g in groups} == {RUN_NAME, "sys"} and any(
            ORG_NAME in g["path"] for g in groups
        )
