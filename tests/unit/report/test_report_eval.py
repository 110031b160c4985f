"""flux-cluster report on flux-cluster evaluate results (issue 15): eval_<k>.json and its grid read into the
report, environments side by side with --price SYSTEM=USD, and the shipped single-machine cloud systems.
The eval files are written here as the contract says evaluate writes them; the runs as in
test_report_finetune (in process: no training, no browser; the HTML in a browser is test_report's)."""

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from report_samples import _latency, eval_document
from rich.console import Console
from test_report_finetune import fine_tuning_run, two_systems
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.report.build import Options, build
from flux_cluster.report.evaluation import MAX_GRID_BYTES
from flux_cluster.report.formats import print_tables, render_csv, render_json, render_markdown
from flux_cluster.report.html import render_html

__all__ = ["two_systems"]  # test_report_finetune's fixture: systems a (8 GPUs, $2) and b (4 GPUs, $3)

CLOUD_SYSTEMS = ("aws_p5", "gcp_a3_highgpu", "azure_nd_h100_v5", "ondemand_h100x8")


def png(path: Path, size: tuple[int, int] = (64, 32)) -> Path:
    Image.new("RGB", size, (200, 30, 30)).save(path, format="PNG")
    return path


def write_eval(run: Path, k: int = 0, with_grid: bool = True, **changes: Any) -> Path:
    results = run / "results"
    path = results / f"eval_{k}.json"
    path.write_text(json.dumps(eval_document(**{"grid": f"eval_{k}_grid.png", **changes})))
    if with_grid:
        png(results / f"eval_{k}_grid.png")
    return path


def test_eval_results_are_read_into_every_format(two_systems: tuple[Path, Path]) -> None:
    a, b = two_systems
    write_eval(a)
    write_eval(b, 0, system="b", latency={"base": _latency(0.25), "tuned": _latency(0.3)})
    tiny = {"latency": {"base": _latency(0.35), "tuned": None}, "clip_score": {"base": 20.0, "tuned": None,
            "clip_model": "x"}, "val_loss": None, "grid": None}  # fmt: skip
    write_eval(
        b,
        1,
        with_grid=False,
        system="b",
        meaningful=False,
        meaningful_reason="tiny random-init",
        base_precision="nf4",
        **tiny,
    )
    ga, gb = build([a, b], Options(check=False))

    (e,) = ga.evals
    assert e.meaningful and e.weights_kind == "lora" and e.settings["steps"] == 4 and e.base and e.tuned
    assert e.base.p50_s == 0.5 and e.tuned.p99_s == pytest.approx(0.72) and e.tuned.samples == 100
    assert e.clip_base == 30.25 and e.clip_tuned == 31.5 and e.val_loss_tuned == 0.44
    assert e.grid == str(a / "results" / "eval_0_grid.png") and e.grid_data_uri
    assert e.grid_data_uri.startswith("data:image/png;base64,iVBORw0KGgo")
    assert ga.inference_p50_s == 0.6 and ga.inference_p99_s == pytest.approx(0.72)  # the tuned model's
    assert ga.clip_score_base == 30.25 and ga.clip_score_tuned == 31.5 and ga.evals_meaningful
    # b: means over its two evals; the second measured the base model only and means nothing
    assert gb.inference_p50_s == pytest.approx((0.3 + 0.35) / 2) and gb.clip_score_tuned == 31.5
    assert gb.clip_score_base == pytest.approx((30.25 + 20.0) / 2) and gb.evals_meaningful is False
    assert gb.val_loss_base == 0.52 and gb.evals[1].grid is None and gb.evals[1].val_loss_base is None
    assert e.base_precision == "bf16" and gb.evals[1].base_precision == "nf4"  # the base its columns measured
    assert "eval_1.json: figures NOT MEANINGFUL: tiny random-init" in gb.warnings
    assert not any("eval_0" in w for w in ga.warnings + gb.warnings), ga.warnings + gb.warnings

    document = json.loads(render_json([ga, gb]))
    evals = document["groups"][0]["evals"]
    assert evals[0]["tuned"]["p50_s"] == 0.6 and evals[0]["clip_tuned"] == 31.5
    assert "grid_data_uri" not in evals[0] and evals[0]["grid"].endswith("eval_0_grid.png")
    rows = {r["system"]: r for r in csv.DictReader(io.StringIO(render_csv([ga, gb])))}
    assert (
        float(rows["a"]["inference_p99_s"]) == pytest.approx(0.72)
        and rows["b"]["evals_meaningful"] == "False"
    )

    markdown = render_markdown([ga, gb])
    side = markdown.split("## Fine-tuning, side by side")[1].split("\n\n")[1].splitlines()
    header = [c.strip() for c in side[0].strip("|").split("|")]
    cells = {r[0]: dict(zip(header, r, strict=True)) for r in (
        [c.strip() for c in line.strip("|").split("|")] for line in side[2:])}  # fmt: skip
    assert (
        cells["a"]["p50 s"] == "0.6" and cells["a"]["p99 s"] == "0.72" and cells["a"]["CLIP tuned"] == "31.5"
    )
    star = "&#42;"  # * (not meaningful), as Markdown shows it
    assert cells["b"]["p50 s"] == "0.325" + star and cells["b"]["CLIP base"] == "25.12" + star
    table = markdown.split("### Evaluations")[2].split("\n\n")[1]  # b's
    assert "| eval_1.json | NO: tiny random-init |" in table and "| 0.35 | - |" in table
    assert "| lora | nf4 |" in table and "| lora | bf16 |" in table

    out = io.StringIO()
    print_tables([ga, gb], Console(file=out, width=250), checked=False)
    assert "Evaluations: b" in out.getvalue() and "NO: tiny random-init" in out.getvalue()
    side_table = out.getvalue().split("Fine-tuning, side by side")[1]
    assert "best val loss" in side_table and "CLIP tuned" in side_table and "31.5" in side_table
    assert "final val loss" not in side_table and "CLIP base" not in side_table  # compact: --wide has them
    out = io.StringIO()
    print_tables([ga, gb], Console(file=out, width=250), checked=False, wide=True)
    side_table = out.getvalue().split("Fine-tuning, side by side")[1]
    assert "final val loss" in side_table and "0.4700" in side_table  # a's runs end at 0.47
    assert "CLIP base" in side_table

    page = render_html([ga, gb], checked=False)
    section = page.split('id="evaluations"')[1].split("<h2")[0]
    assert section.count('<img src="data:image/png;base64,') == 2  # a's and b's eval_0; b's eval_1 has none
    assert "eval_0.json: base vs fine-tuned images" in section and "NO: tiny random-init" in section
    # every latency figure the README promises, for both models: p90, images/s and peak memory too
    headers = section.split("<tr>", 2)[1].split("</tr>")[0]
    for header in ("p90 s base", "p90 s tuned", "images/s base", "images/s tuned", "peak GB base"):
        assert f'<th class="">{header}</th>' in headers, header
    a_row = section.split('<td class="name">eval_0.json</td>')[1].split("</tr>")[0]
    assert '<td class="">0.55</td>' in a_row and '<td class="">0.66</td>' in a_row  # p90 of 0.5, 0.6
    assert '<td class="">30.5</td>' in a_row and '<td class="">2</td>' in a_row  # peak GB, 1/0.5 images/s
    assert "Inference p50 / CLIP" in page and 'aria-label="Environments side by side' in page


def write_alone(path: Path, with_grid: bool = True, **changes: Any) -> Path:
    """An evaluation outside a run, as `evaluate TARGET --output path` writes it: the base model alone
    unless changes say otherwise, the grid beside it as <stem>_grid.png."""
    base_only = {"weights": None, "weights_kind": None, "target": "/models/FLUX.1-schnell", "val_loss": None,
                 "latency": {"base": _latency(0.5), "tuned": None},
                 "clip_score": {"base": 30.0, "tuned": None, "clip_model": "x"}}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    grid = path.stem + "_grid.png"
    path.write_text(
        json.dumps(eval_document(**{**base_only, "grid": grid if with_grid else None, **changes}))
    )
    if with_grid:
        png(path.with_name(grid))
    return path


def test_evaluations_outside_runs_are_found_and_grouped_by_system(tmp_path: Path, cli: CliRunner) -> None:
    """evaluate's --output files (any name) in the folders given, or named themselves: a group per system
    they record (a folder's for those without), beside the runs, compared on inference alone."""
    root = tmp_path / "evals"
    write_alone(root / "aws" / "base.json", system="aws_p5", device="NVIDIA H100 80GB HBM3")
    write_alone(
        root / "aws" / "later" / "eval.json",
        system="aws_p5",
        device="NVIDIA A100-SXM4-80GB",
        latency={"base": _latency(0.7), "tuned": None},
    )
    gcp = {"latency": {"base": _latency(0.4), "tuned": None}, "clip_score": {"base": 33.0, "tuned": None}}
    write_alone(root / "gcp" / "eval.json", system="gcp_a3_highgpu", **gcp)
    write_alone(root / "nosys" / "eval.json", system=None, with_grid=False)
    (root / "gcp" / "other.json").write_text('{"kind": "something else", "schema": 1}')  # not an evaluation
    write_alone(root / "gcp" / ".hidden.json", system="gcp_a3_highgpu")  # hidden: not read
    write_alone(root / "misnamed.json", system="aws_p5", grid="eval_0_grid.png")
    png(root / "eval_0_grid.png")  # another evaluation's grid name: not taken
    (root / "broken.json").write_text(json.dumps(eval_document(schema=2)))
    run = fine_tuning_run(tmp_path / "ft")
    write_eval(run)  # a run's evaluation: its group's, also when named on its own
    paths = [root, run, run / "results" / "eval_0.json", root / "gcp" / "eval.json"]
    groups = build(paths, Options(check=False, prices={"aws_p5": 6.0}))

    assert [(g.system, g.benchmark) for g in groups] == [
        ("ft", "finetune"), ("aws_p5", "evaluate"), ("gcp_a3_highgpu", "evaluate"), (None, "evaluate"),
        (None, "evaluate"),
    ]  # fmt: skip
    ft, aws, gcp, loose, nosys = groups
    assert [e.name for e in ft.evals] == ["eval_0.json"] and ft.fine_tuning
    assert [e.name for e in aws.evals] == ["misnamed.json", "base.json", "eval.json"]  # folder by folder
    assert aws.path == str(root) and aws.runs == [] and aws.accelerator_model is None  # H100 and an A100
    assert aws.inference_p50_s == pytest.approx((0.5 + 0.7 + 0.5) / 3) and aws.clip_score_tuned is None
    assert aws.price_per_gpu_hour == 6.0 and aws.cost_usd is None  # no run, no GPU-hours
    assert aws.evals[1].grid_data_uri and aws.evals[0].grid is None
    assert aws.warnings == [f"{root / 'misnamed.json'}: grid: got 'eval_0_grid.png', expected null or "
                            "misnamed_grid.png (the grid beside the JSON)"]  # fmt: skip
    assert [e.name for e in gcp.evals] == ["eval.json"] and gcp.clip_score_base == 33.0 and gcp.warnings == []
    # What 1,000 images cost on one GPU: --price for aws_p5, the shipped system's own price for gcp.
    assert aws.inference_usd_per_1k_images == pytest.approx(1000 / aws.inference_images_per_s / 3600 * 6.0)
    from flux_cluster.config import load_system

    gcp_price = load_system("gcp_a3_highgpu").config.price_per_gpu_hour
    assert gcp_price and gcp.price_per_gpu_hour == gcp_price
    per_1k = 1000 / gcp.inference_images_per_s / 3600 * gcp_price
    assert gcp.inference_usd_per_1k_images == pytest.approx(per_1k)
    assert gcp.accelerator_model == "NVIDIA H100 80GB HBM3" and gcp.evals[0].grid_data_uri
    assert loose.path == str(root) and loose.evals == []
    assert loose.warnings == [f"{root / 'broken.json'}: schema: got 2, expected 1; skipped"]
    assert nosys.path == str(root / "nosys") and [e.name for e in nosys.evals] == ["eval.json"]
    assert nosys.price_per_gpu_hour is None and nosys.inference_usd_per_1k_images is None

    markdown = render_markdown(groups)
    assert "| system | benchmark |" not in markdown  # no MLPerf group, so no MLPerf table
    side = markdown.split("## Fine-tuning, side by side")[1].split("\n\n")[1].splitlines()[2:]
    assert [row.split(" | ")[:3:2] for row in side] == [  # (system, mode)
        ["| ft", "lora"],
        ["| aws_p5", "eval only"],
        ["| gcp_a3_highgpu", "eval only"],
        ["| nosys", "eval only"],
    ]  # fmt: skip (the broken file's group has no evaluation to compare)
    out = io.StringIO()
    print_tables(groups, Console(file=out, width=250), checked=False)
    assert f"Evaluations: aws_p5 (evaluate): {root}" in out.getvalue()
    page = render_html(groups, checked=False)
    assert page.count('aria-label="Environments side by side') == 1 and "aws_p5 (inference)" in page
    assert "not shown: aws_p5" not in page  # the training plots are about the run alone
    assert "Inference p50 / p99" in page and "0.567 / 0.68 s" in page  # aws_p5's card

    compared = cli.invoke(
        app, ["report", "--compare", str(root / "aws"), str(root / "gcp"), "--no-check", "-f", "json"]
    )
    assert compared.exit_code == 0, compared.output
    (pair,) = json.loads(compared.stdout)["comparison"]["pairs"]
    ratios = {m["key"]: m["ratio"] for m in pair["metrics"]}
    assert ratios["inference_p50_s"] == pytest.approx(0.4 / 0.6) and ratios["clip_score_base"] == 1.1
    one = cli.invoke(
        app, ["report", str(root / "gcp" / "eval.json"), "--price", "gcp_a3_highgpu=3", "-f", "csv"]
    )
    assert one.exit_code == 0 and "warning" not in one.output, one.output
    (row,) = csv.DictReader(io.StringIO(one.stdout))
    assert (
        row["system"] == "gcp_a3_highgpu"
        and float(row["inference_p50_s"]) == 0.4
        and row["price_per_gpu_hour"] == "3.0"
    )


def _hostile(run: Path) -> dict[str, str]:
    """Hostile eval files in run/results; the warning each must give."""
    results = run / "results"
    nan = eval_document(clip_score={"base": math.nan, "tuned": "high", "clip_model": ["x"]})
    (results / "eval_0.json").write_text(json.dumps(nan))  # json writes NaN, as Python's json reads it
    latency = {"base": _latency(-1, samples=2.5), "tuned": "fast"}
    types = eval_document(
        meaningful="yes",
        weights_kind="full",
        settings=[1],
        latency=latency,
        grid="../../x.png",
        base_precision="int3",
    )
    (results / "eval_1.json").write_text(json.dumps(types))
    (results / "eval_2.json").write_text('{"a": "' + "x" * (2 << 20) + '"}')  # over the read cap
    (results / "eval_3.json").write_text(json.dumps(eval_document(grid="eval_3_grid.png")))
    (results / "eval_3_grid.png").write_bytes(b"<svg onload=alert(1)>" + b"x" * 100)  # not a PNG
    (results / "eval_4.json").write_text(json.dumps(eval_document(grid="eval_4_grid.png")))
    with (results / "eval_4_grid.png").open("wb") as handle:  # a PNG's header, then past the size cap
        handle.write(png(results / "small.png").read_bytes())
        handle.truncate(MAX_GRID_BYTES + 1)
    (results / "eval_5.json").write_text(json.dumps(eval_document(kind="other")))
    (results / "eval_6.json").write_text(json.dumps(eval_document(schema=2)))
    (results / "eval_7.json").write_text("[1, 2")
    (results / "eval_8.json").write_text(json.dumps(eval_document(grid="eval_8_grid.png")))  # grid missing
    e = results
    return {
        "0": f"{e / 'eval_0.json'}: clip_score.base: got nan, expected a finite number >= 0",
        "0t": f"{e / 'eval_0.json'}: clip_score.tuned: got 'high', expected a finite number >= 0",
        "0m": f"{e / 'eval_0.json'}: clip_score.clip_model: got ['x'], expected a text of at most 500 "
        "characters or null",
        "1": f"{e / 'eval_1.json'}: meaningful: got 'yes', expected true or false (taken as false)",
        "1k": f"{e / 'eval_1.json'}: weights_kind: got 'full', expected one of ('lora', 'transformer') "
        "or null",
        "1s": f"{e / 'eval_1.json'}: settings: got [1], expected an object",
        "1b": f"{e / 'eval_1.json'}: base_precision: got 'int3', expected one of ('bf16', 'fp8', 'nf4') or "
        "absent (bf16)",
        "1p": f"{e / 'eval_1.json'}: latency.base.p50_s: got -1, expected a finite number >= 0",
        "1n": f"{e / 'eval_1.json'}: latency.base.samples: got 2.5, expected a whole number >= 1",
        "1t": f"{e / 'eval_1.json'}: latency.tuned: got 'fast', expected an object or null",
        "1g": f"{e / 'eval_1.json'}: grid: got '../../x.png', expected null or eval_1_grid.png (the grid "
        "beside the JSON)",
        "2": f"{e / 'eval_2.json'}: not readable JSON (over 1 MiB); skipped",
        "3": f"{e / 'eval_3.json'}: grid: eval_3_grid.png is not a PNG image; not shown",
        "4": f"{e / 'eval_4.json'}: grid: eval_4_grid.png is over 8 MiB; not shown",
        "5": f"{e / 'eval_5.json'}: kind: expected 'flux-cluster-eval' (a flux-cluster evaluate result); "
        "skipped",
        "6": f"{e / 'eval_6.json'}: schema: got 2, expected 1; skipped",
        "7": f"{e / 'eval_7.json'}: not readable JSON (JSONDecodeError); skipped",
        "8": f"{e / 'eval_8.json'}: grid: eval_8_grid.png is missing or unreadable; not shown",
    }


def test_hostile_eval_files_give_warnings_never_a_crash(tmp_path: Path, cli: CliRunner) -> None:
    run = fine_tuning_run(tmp_path / "evil")
    expected = _hostile(run)
    (group,) = build([run], Options(check=False))
    for key, warning in expected.items():
        assert warning in group.warnings, (key, group.warnings)
    assert [e.name for e in group.evals] == ["eval_0.json", "eval_1.json", "eval_3.json", "eval_4.json",
                                             "eval_8.json"]  # fmt: skip
    bad, types = group.evals[0], group.evals[1]
    assert bad.clip_base is None and bad.clip_tuned is None and bad.base and bad.base.p50_s == 0.5
    assert not types.meaningful and types.base and types.base.p50_s is None and types.tuned is None
    assert types.base_precision is None  # an unknown one is not shown as a base it never named
    assert types.base.p90_s is None  # negative: left out
    assert all(e.grid_data_uri is None for e in group.evals)  # no grid passed
    assert group.clip_score_base == 30.25  # the good files' mean; the NaN one left out
    for fmt in ("table", "csv", "md", "json", "html"):
        result = cli.invoke(app, ["report", str(run), "--no-check", "--format", fmt])
        assert result.exit_code == 0 and "Traceback" not in result.output, (fmt, result.output[-2000:])
        assert "onload" not in result.stdout and "<img" not in result.stdout  # no grid passed


def test_side_by_side_two_systems_with_a_price_per_system(
    two_systems: tuple[Path, Path], cli: CliRunner
) -> None:
    a, b = two_systems
    write_eval(a)
    write_eval(b, system="b")
    args = ["report", str(a), str(b), "--no-check", "--price", "a=1.5", "--price", "b=0.5"]
    result = cli.invoke(app, [*args, "-f", "json"])
    assert result.exit_code == 0, result.output
    groups = {g["system"]: g for g in json.loads(result.stdout)["groups"]}
    # a: 8 GPUs, runs of 30 and 34 min, at $1.5 (its config says $2); b: 4 GPUs, 20 min, at $0.5 (not $3)
    assert groups["a"]["price_per_gpu_hour"] == 1.5 and groups["a"]["cost_usd"] == pytest.approx(
        32 * 8 / 60 * 1.5
    )
    assert groups["b"]["cost_usd"] == pytest.approx(20 * 4 / 60 * 0.5)
    csv_rows = list(csv.DictReader(io.StringIO(cli.invoke(app, [*args, "-f", "csv"]).stdout)))
    assert {r["system"]: float(r["cost_usd"]) for r in csv_rows} == pytest.approx({"a": 6.4, "b": 2 / 3})
    markdown = cli.invoke(app, [*args, "--price", "3", "-f", "md"]).stdout  # a bare USD: the others
    side = markdown.split("## Fine-tuning, side by side")[1].split("\n\n")[1].splitlines()
    b_row, a_row = side[2], side[3]  # cheapest first
    assert b_row.startswith("| b | b | lora | 4 | H100 | 1 | 20.00 | 150.0 |")
    # ... and 1,000 images at 1/0.6 images/s on one GPU at $0.5/GPU-hour: $0.0833
    assert b_row.endswith("| 1.33 | 0.67 | 0.67 | measured | 0.6 | 0.72 | 0.08333 | 30.25 | 31.5 |")
    assert (
        a_row.startswith("| a | a | lora | 8 | H100 | 2 | 32.00 | 100.0 |")
        and "| 4.27 | 6.40 | 12.80 |" in a_row
    )

    compared = cli.invoke(app, ["report", "--compare", str(a), str(b), "--no-check", "-f", "json"])
    (pair,) = json.loads(compared.stdout)["comparison"]["pairs"]
    ratios = {m["key"]: m["ratio"] for m in pair["metrics"]}
    assert ratios["inference_p50_s"] == 1.0 and ratios["clip_score_tuned"] == 1.0  # the same eval file

    one = cli.invoke(
        app, ["report", str(a), "--no-check", "--price", "a=1.5", "--price", "c=9", "-f", "json"]
    )
    assert one.exit_code == 0 and "warning: --price c=...: no group of system 'c' (systems: a)" in one.output
    for bad in ("a=cheap", "a=-1", "=2", "a=nan", "inf"):
        result = cli.invoke(app, ["report", str(a), "--no-check", "--price", bad])
        assert result.exit_code == 2 and "Traceback" not in result.output, (bad, result.output)
        assert result.output.strip().splitlines() == [
            f"error: --price {bad!r}: expected SYSTEM=USD or USD, USD a number >= 0 (e.g. aws_p5=6.88)"
        ], result.output


def test_the_single_machine_cloud_systems_load_and_are_listed(cli: CliRunner, workdir: Path) -> None:
    from flux_cluster.config import load_system

    listing = cli.invoke(app, ["systems", "list"])
    assert listing.exit_code == 0
    for name in CLOUD_SYSTEMS:
        config = load_system(name).config
        assert config.launcher == "local" and config.nodes == 1 and config.gpus_per_node == 8
        assert (
            config.gpu_model == "H100-SXM5-80GB"
            and config.vendor == "nvidia"
            and config.peak_bf16_tflops == 989
        )
        assert config.price_per_gpu_hour > 0 and config.price_date == "2026-11"
        assert config.price_source and config.price_source.startswith("https://")
        assert name in listing.output and f"{config.price_per_gpu_hour:.2f}" in listing.output
    bad = cli.invoke(app, ["systems", "show", "aws_p5", "--set", "price_date=" + "x" * 41])
    assert bad.exit_code == 2 and "price_date" in bad.output and "Traceback" not in bad.output


def test_a_system_name_in_an_eval_file_never_opens_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The price of an evaluation's system comes from a known system only: a results file naming a path
    (here a YAML beside the working directory) is not read."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "evil.yaml").write_text("extends: local\nprice_per_gpu_hour: 99\n")
    write_alone(tmp_path / "evals" / "eval.json", system="evil.yaml")
    (group,) = build([tmp_path / "evals"], Options(check=False))
    assert group.system == "evil.yaml" and group.price_per_gpu_hour is None
    assert group.inference_usd_per_1k_images is None
