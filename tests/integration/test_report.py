"""flux-cluster report against the official result_summarizer, on real MLPerf v5.1 logs and crafted ones."""

import csv
import io
import json
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from report_samples import GROUP, LORA_RUN, sample
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.report import plots
from flux_cluster.report.build import Options, build
from flux_cluster.report.harvest import harvest_run
from flux_cluster.report.scoring import olympic_average

__all__ = ["sample"]  # report_samples' fixtures, used here

OFFICIAL_MINUTES = 160.70693958333334
OFFICIAL_SAMPLES = 8_388_608


def summarizer(tree: Path, tmp: Path) -> dict[str, str]:
    """The official tool's flux1 row (its CSV keeps full precision; its JSON rounds to 10 digits)."""
    out = tmp / "summary.csv"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mlperf_logging.result_summarizer",
            "NVIDIA",
            "training",
            "5.1.0",
            "--csv",
            str(out),
        ],
        cwd=tree,
        check=True,
        capture_output=True,
    )
    (row,) = csv.DictReader(out.with_name("summary_detailed.csv").open())
    return row


@pytest.fixture
def tree(sample: Path, tmp_path: Path) -> Path:
    """A copy of the sample to change (the summarizer also writes files where it runs)."""
    shutil.copytree(sample, tmp_path / "sample")
    return tmp_path / "sample"


def report_json(cli: CliRunner, *args: str) -> dict:
    result = cli.invoke(app, ["report", *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_scores_equal_the_official_summarizer_on_real_v51_logs(
    cli: CliRunner, tree: Path, tmp_path: Path
) -> None:
    official = summarizer(tree, tmp_path)
    assert abs(float(official["flux1:time_to_train"]) - OFFICIAL_MINUTES) < 1e-9
    for check in ("--check", "--no-check"):
        (group,) = report_json(cli, str(tree), check)["groups"]
        assert abs(group["olympic_minutes"] - float(official["flux1:time_to_train"])) < 1e-6, check
        assert abs(group["olympic_minutes"] - OFFICIAL_MINUTES) < 1e-6
        assert (
            group["samples_to_converge"] == float(official["flux1:samples_to_converge"]) == OFFICIAL_SAMPLES
        )
        assert group["accelerators"] == int(official["accelerators_count"]) == 16
        assert group["gpu_hours"] == pytest.approx(OFFICIAL_MINUTES * 16 / 60)
        assert (
            group["path"] == str(tree / GROUP) and group["benchmark"] == "flux1" and group["run_count"] == 10
        )
        assert all(r["status"] == "success" and r["scored"] for r in group["runs"])
        assert {r["compliance"] for r in group["runs"]} == (
            {"passed"} if check == "--check" else {"not checked"}
        )
        assert 50 < group["throughput_per_accelerator"] < 60  # GB200: ~56 samples/s per GPU (v5.1 notes)


def test_json_names_are_the_documented_schema(sample: Path, cli: CliRunner) -> None:
    document = report_json(cli, str(sample), "--no-check", "--price", "2.5", "--peak-tflops", "2500")
    (group,) = document["groups"]
    group_keys = (
        "path benchmark olympic_minutes runs accelerators gpu_hours cost_usd throughput_samples_per_s"
    )
    for key in (*group_keys.split(), "mean_minutes", "min_minutes", "max_minutes", "samples_to_converge"):
        assert key in group, key
    for key in ("file", "status", "minutes", "samples_to_converge", "final_eval_loss", "global_batch_size",
                "learning_rate", "warmup_steps", "evals", "eval_minutes", "throughput_samples_per_s",
                "throughput_per_accelerator", "compliance"):  # fmt: skip
        assert key in group["runs"][0], key
    assert group["cost_usd"] == pytest.approx(group["gpu_hours"] * 2.5)
    assert group["mfu"] == pytest.approx(group["throughput_per_accelerator"] * 20.42e12 / 2500e12, rel=1e-3)
    run = group["runs"][0]
    assert run["file"].endswith("result_0.txt") and run["samples_to_converge"] == 7_864_320
    assert run["global_batch_size"] == 512 and run["learning_rate"] == 0.0002 and run["warmup_steps"] == 1600
    assert run["minutes"] == pytest.approx((1759772002593 - 1759762953618) / 60000)


def _write(path: Path, lines: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(lines))
    return path


def _lines(sample: Path) -> list[bytes]:
    return (sample / GROUP / "result_0.txt").read_bytes().splitlines(keepends=True)


def test_crafted_logs_give_a_status_and_a_warning_never_a_crash(sample: Path, tmp_path: Path) -> None:
    original = harvest_run(sample / GROUP / "result_0.txt")
    lines = _lines(sample)
    stop = next(i for i, line in enumerate(lines) if b'"run_stop"' in line)

    truncated = harvest_run(_write(tmp_path / "truncated.txt", [*lines[: stop - 5], lines[stop - 5][:40]]))
    assert truncated.status == "incomplete" and truncated.minutes is None
    assert any("no run_stop" in w for w in truncated.warnings) and any(
        "malformed" in w for w in truncated.warnings
    )

    junk = [
        b"\x00\xff\xfe garbage\n",
        b":::MLLOG {not json\n",
        b":::MLLOG " + "caf\u00e9".encode("latin-1") + b"\n",
    ]
    garbled = harvest_run(_write(tmp_path / "garbled.txt", lines[:100] + junk + lines[100:]))
    assert garbled.status == "success" and garbled.minutes == original.minutes
    assert any("2 malformed" in w for w in garbled.warnings) and any(
        "non-UTF-8" in w for w in garbled.warnings
    )

    empty = harvest_run(_write(tmp_path / "empty.txt", []))
    assert empty.status == "incomplete" and empty.warnings == ["empty file"]

    start = next(i for i, line in enumerate(lines) if b'"run_start"' in line)
    earlier = lines[start].replace(b'"time_ms": 1759762953618', b'"time_ms": 1759762900000')
    twice = harvest_run(_write(tmp_path / "twice.txt", [*lines[:start], earlier, *lines[start:]]))
    assert any("run_start x2" in w for w in twice.warnings)
    assert twice.minutes == original.minutes  # as the summarizer: the last run_start before run_stop


def test_lines_read_as_the_official_parser_reads_them(sample: Path, tmp_path: Path) -> None:
    original = harvest_run(sample / GROUP / "result_0.txt")
    lines = _lines(sample)
    start = next(i for i, line in enumerate(lines) if b'"run_start"' in line)
    stop = next(i for i, line in enumerate(lines) if b'"run_stop"' in line)
    odd = list(lines)
    odd[start] = odd[start].rstrip(b"\n") + b"\r 45%|####      | 12/27 [00:03<00:04]\n"  # a progress bar
    odd[stop] = odd[stop].rstrip(b"\n") + b"\x0c\n"  # str.strip() removes a form feed
    for key, value in (("number_of_nodes", b"4"), ("accelerators_per_node", b"4")):  # a nested "key" first
        nested = b':::MLLOG {"time_ms": 1, "metadata": {"key": "x"}, "key": "%s", "value": %s}\n'
        odd.insert(start, nested % (key.encode(), value))
    run = harvest_run(_write(tmp_path / "odd.txt", odd))
    assert run.status == "success" and run.minutes == original.minutes and run.accelerators_from_log == 16
    diverged = [
        line.replace(b'"value": 0.5859129675503435', b'"value": NaN') if b'"eval_accuracy"' in line else line
        for line in lines
    ]
    run = harvest_run(_write(tmp_path / "nan.txt", diverged))
    assert run.evals == 29 and run.samples_to_converge is None and run.status == "success"


def test_interleaved_ranks_with_srun_labels_read_as_one_run(sample: Path, tmp_path: Path) -> None:
    lines = _lines(sample)
    mixed = [
        label + line
        for pair in zip(lines, lines, strict=True)
        for label, line in zip((b"0: ", b"1: "), pair, strict=True)
    ]
    run = harvest_run(_write(tmp_path / "ranks.log", mixed))
    original = harvest_run(sample / GROUP / "result_0.txt")
    assert run.status == "success" and run.minutes == original.minutes
    assert run.evals == original.evals == 30 and run.eval_curve == original.eval_curve
    assert run.throughput_samples_per_s == pytest.approx(original.throughput_samples_per_s)
    assert run.eval_minutes == pytest.approx(original.eval_minutes)
    assert any("duplicate keys" in w for w in run.warnings)


def test_failed_runs_follow_the_summarizer(tree: Path, tmp_path: Path) -> None:
    group = tree / GROUP
    lines = (group / "result_3.txt").read_bytes().splitlines(keepends=True)
    (group / "result_3.txt").write_bytes(b"".join(lines[:-30]))  # truncated: no run_stop
    one = group / "result_1.txt"  # an early eval below the target, the run going on: the RCP rule decides
    one_lines = one.read_text().splitlines(True)
    second = [i for i, line in enumerate(one_lines) if "eval_accuracy" in line][1]
    event = json.loads(one_lines[second].removeprefix(":::MLLOG "))
    one_lines[second] = ":::MLLOG " + json.dumps({**event, "value": 0.5801}) + "\n"
    one.write_text("".join(one_lines))
    six = group / "result_6.txt"  # a log's own, stricter target
    six.write_bytes(six.read_bytes().replace(b'"value": 0.586,', b'"value": 0.5855,', 1))
    shutil.copy(group / "result_0.txt", group / "slurm-4242.out")  # not a result_*.txt: not a run
    official = summarizer(tree, tmp_path)
    (checked,) = build([tree], Options(check=True))
    assert checked.olympic_minutes == pytest.approx(float(official["flux1:time_to_train"]), abs=1e-6)
    assert checked.samples_to_converge == float(official["flux1:samples_to_converge"])
    assert checked.run_count == 10 and checked.runs[1].samples_to_converge == 524_288
    assert checked.scored_runs == 9 and not checked.runs[3].scored and checked.runs[3].compliance == "failed"
    scores = sorted(r.minutes for r in checked.runs if r.scored)
    assert checked.olympic_minutes == pytest.approx(sum(scores[1:]) / 8)  # the failed run is the worst

    (group / "result_5.txt").write_bytes(b"".join(lines[:-30]))
    (two_failed,) = build([tree], Options(check=False))
    assert two_failed.olympic_minutes is None and two_failed.minutes_basis == "measured"
    timed = [r.minutes for r in two_failed.runs if r.minutes is not None]  # GPU-hours of the 8 timed runs
    assert len(timed) == 8 and two_failed.gpu_hours == pytest.approx(sum(timed) / 8 * 16 / 60)
    assert any("more than 1 allowed" in w for w in two_failed.warnings)


def test_olympic_average_edge_cases() -> None:
    assert olympic_average([3.0, 1.0, 2.0], dropped=0) == 2.0
    assert olympic_average([1.0, 2.0], dropped=0) is None  # too few runs: nothing left to count
    assert olympic_average([1.0, 2.0], dropped=1) == 2.0
    assert olympic_average([5.0, 1.0, 2.0, 9.0], dropped=0) == 3.5


def test_exit_codes_tell_nothing_found_from_reported(cli: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "empty_dir" / "notes.txt").write_text("no logs here\n")
    nothing = cli.invoke(app, ["report", str(tmp_path / "empty_dir")])
    assert nothing.exit_code == 1 and "no MLPerf result logs" in nothing.output
    missing = cli.invoke(app, ["report", str(tmp_path / "nope")])
    assert (
        missing.exit_code == 2 and missing.output.startswith("error:") and "Traceback" not in missing.output
    )
    _write(tmp_path / "one" / "result_0.txt", [])
    found = cli.invoke(app, ["report", str(tmp_path / "one"), "--no-check"])
    assert found.exit_code == 0 and "empty file" in found.output
    markup = tmp_path / "x[/y]" / "result_[bold red].txt"  # rich markup in names is text
    _write(
        markup,
        [b':::MLLOG {"time_ms": 1, "key": "submission_platform", "value": "GB200 [/]", "metadata": {}}\n'],
    )
    shown = cli.invoke(app, ["report", str(markup.parent), "--no-check"])
    assert shown.exit_code == 0 and "result_[bold red].txt" in shown.output, shown.output
    assert cli.invoke(app, ["report", str(markup.parent), "-o", str(tmp_path)]).exit_code == 2


def test_memory_stays_bounded_on_a_big_log(sample: Path, tmp_path: Path) -> None:
    lines = _lines(sample)
    stats = [line for line in lines if b"tracked_stats" in line]
    body_at = next(i for i, line in enumerate(lines) if b'"run_start"' in line) + 1
    big = tmp_path / "big.txt"
    with big.open("wb") as out:
        out.writelines(lines[:body_at])
        for _ in range(200):  # ~60 MB of per-step statistics
            out.writelines(stats * 1)
        out.writelines(lines[body_at:])
    tracemalloc.start()
    run = harvest_run(big)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert big.stat().st_size > 50e6 and run.status == "success"
    assert peak < 2e6, f"harvesting a {big.stat().st_size / 1e6:.0f} MB log peaked at {peak / 1e6:.1f} MB"


def test_formats_agree_and_outputs_are_written_atomically(
    sample: Path, cli: CliRunner, tmp_path: Path
) -> None:
    document = report_json(cli, str(sample), "--no-check")
    for fmt in ("csv", "md", "table", "html"):
        out = tmp_path / f"report.{fmt}"
        result = cli.invoke(app, ["report", str(sample), "--no-check", "--format", fmt, "--output", str(out)])
        assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report.csv",
        "report.html",
        "report.md",
        "report.table",
    ]
    (row,) = csv.DictReader(io.StringIO((tmp_path / "report.csv").read_text()))
    assert float(row["olympic_minutes"]) == document["groups"][0]["olympic_minutes"]
    assert (
        "| tyche_ngpu16_ngc25.09_nemo (Tyche (1x NVIDIA GB200 NVL72)) | flux1 | 16 | 10/10 | 160.71 |"
        in (tmp_path / "report.md").read_text()
    )
    assert "160.71" in (tmp_path / "report.table").read_text()


def test_compare_gives_ratios(cli: CliRunner, tree: Path, tmp_path: Path) -> None:
    faster = tmp_path / "b"
    shutil.copytree(tree, faster)
    (faster / GROUP / "scaling.json").write_text('{"scaling_factor": 0.5}')
    document = report_json(cli, "--compare", str(tree), str(faster), "--no-check")
    (pair,) = document["comparison"]["pairs"]
    ratios = {m["key"]: m["ratio"] for m in pair["metrics"]}
    assert ratios["olympic_minutes"] == pytest.approx(0.5)  # the RCP-scaled score
    assert ratios["gpu_hours"] == pytest.approx(1.0)  # what the runs took: the measured time
    assert ratios["throughput_per_accelerator"] == pytest.approx(1.0)
    table = cli.invoke(app, ["report", "--compare", str(tree), str(faster), "--no-check"])
    assert table.exit_code == 0 and "0.500x" in table.output


GRID_RGB = (0, 201, 87)  # the test's sample grid: one colour the page has nowhere else
WIDTHS = """<script>document.body.insertAdjacentHTML("beforeend", "<pre id=widths>" +
  [document.documentElement, ...document.querySelectorAll(".scroll")].map(e => e.scrollWidth - e.clientWidth)
  + "</pre>")</script>"""
"""Added to a copy of the page: how far the page and each table box scroll sideways, in pixels."""


def test_html_loads_in_headless_chromium_and_shows_the_plots(
    cli: CliRunner, tree: Path, tmp_path: Path
) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian 'chromium' is not installed (tools/dev.sh test installs it as root)")
    bigger = tmp_path / "more"
    shutil.copytree(tree / "NVIDIA", bigger / "NVIDIA")
    lora = tmp_path / "lora"  # the real LoRA run, evaluated (issue 15): an eval file and its sample grid
    shutil.copytree(LORA_RUN, lora)
    from PIL import Image
    from report_samples import eval_document

    tiny = eval_document(system="local", meaningful=False, meaningful_reason="tiny random-init pipeline")
    (lora / "results" / "eval_0.json").write_text(json.dumps(tiny))
    Image.new("RGB", (256, 128), GRID_RGB).save(lora / "results" / "eval_0_grid.png")
    page = tmp_path / "report.html"
    paths = [str(tree), str(bigger), str(lora)]  # two MLPerf groups and a 640-sample fine-tuning run
    result = cli.invoke(app, ["report", *paths, "--no-check", "--price", "2", "-f", "html", "-o", str(page)])
    assert result.exit_code == 0, result.output
    html = page.read_text()
    measured = tmp_path / "measured.html"
    measured.write_text(html.replace("</body>", WIDTHS + "</body>"))
    for external in (
        "<script",
        "<link",
        'href="http',
        "url(http",
        "@import",
    ):  # self-contained: nothing to fetch
        assert external not in html, external
    assert html.count("src=") == html.count('<img src="data:image/png;base64,') == 1  # the grid, inline
    browser = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [
            *browser,
            "--window-size=1400,1000",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            measured.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<svg") == 6 and "tyche_ngpu16_ngc25.09_nemo" in dom.stdout  # + fine-tuning, side
    assert 'aria-label="Environments side by side' in dom.stdout and 'id="evaluations"' in dom.stdout
    assert (
        "eval_0.json: base vs fine-tuned images" in dom.stdout
        and "NOT MEANINGFUL: tiny random-init" in dom.stdout
    )
    assert 'id="fine-tuning"' in dom.stdout and 'aria-label="Fine-tuning: validation loss' in dom.stdout
    assert "CONSOLE" not in dom.stderr and "Failed to load" not in dom.stderr, dom.stderr[-2000:]
    widths = dom.stdout.split('<pre id="widths">')[1].split("</pre>")[0]
    assert [int(w) for w in widths.split(",")] == [0] * (1 + html.count('class="scroll"')), (
        widths
    )  # at 1,400 px
    assert dom.stdout.index('id="answers"') < dom.stdout.index('id="summary"')  # the answers lead
    assert "$0.11" in dom.stdout and "$85.71" in dom.stdout  # cost per run, with and without a score
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*browser, "--window-size=1400,2600", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    pixels = Image.open(shot).convert("RGB")
    colors = pixels.getcolors(maxcolors=1 << 20) or []
    bar = sum(
        n for n, (r, g, b) in colors if abs(r - 0x71) < 12 and abs(g - 0x8E) < 12 and abs(b - 0xC4) < 12
    )
    assert bar > 5000, "the screenshot shows no throughput/time-to-train bars"
    assert sum(n for n, (r, g, b) in colors if r > 150 and g < 110 and b < 110) > 20, "no scaling points"
    assert sum(n for n, rgb in colors if rgb == GRID_RGB) > 256 * 128 * 0.9, "the sample grid is not shown"


def test_fine_tuning_runs_skip_the_checker_and_cost_their_measured_time(
    cli: CliRunner, workdir: Path, sample: Path
) -> None:
    (lora,) = build([LORA_RUN], Options(check=True, price=2.0))
    (run,) = lora.runs
    assert lora.train_mode == "lora" and run.status == "aborted" and run.minutes  # it ran its sample budget
    assert run.compliance == "not applicable" and not run.scored and lora.olympic_minutes is None
    assert lora.minutes_basis == "measured" and lora.mean_minutes == run.minutes
    assert lora.gpu_hours == pytest.approx(run.minutes * 2 / 60)
    assert lora.cost_usd == lora.total_cost_usd == pytest.approx(lora.gpu_hours * 2)
    assert any(w.startswith("fine-tuning (train.mode lora)") for w in lora.warnings)

    one = workdir / "one" / GROUP  # a benchmark group with no olympic score (one run) costs its measured time
    one.mkdir(parents=True)
    shutil.copy(sample / GROUP / "result_0.txt", one)
    shutil.copytree(sample / GROUP.parents[2] / "systems", workdir / "one" / GROUP.parents[2] / "systems")
    (single,) = build([one], Options(check=False, price=2.0))
    assert single.olympic_minutes is None and single.minutes_basis == "measured" and single.accelerators == 16
    assert single.cost_usd == pytest.approx(single.runs[0].minutes * 16 / 60 * 2)

    (workdir / "base").mkdir()  # the job does not give a fine-tuning log to the checker either
    for sets, checked in (
        (["train.mode=lora", f"train.pretrained_path={workdir / 'base'}"], False),
        ([], True),
    ):
        args = ["submit", "--system", "local", "--dry-run", *(x for s in sets for x in ("--set", s))]
        script = cli.invoke(app, args)
        assert script.exit_code == 0, script.output
        assert ("-m flux_cluster.jobs.compliance" in script.output) is checked, sets


def test_plots_give_each_scale_its_own_panel_and_name_what_they_leave_out(sample: Path) -> None:
    groups = build([sample, LORA_RUN], Options(check=False))
    loss = plots.eval_loss(groups)
    assert loss.svg.count('<g id="axes_') == 2 and loss.wide  # 640 samples beside 9M: two sample axes
    assert plots.eval_loss(groups + groups).svg.count('<g id="axes_') == 2  # same scales share a panel
    left_out = "not shown: local (2, lora): fine-tuning, no olympic score"
    scaling = plots.scaling(groups)
    assert left_out in plots.time_to_train(groups) and left_out in scaling
    assert "scaling needs scores at two or more accelerator counts" in scaling
    assert "not shown" not in plots.throughput(groups)  # every group has a throughput
