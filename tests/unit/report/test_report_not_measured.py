"""A run whose summary has no throughput (its only step was the untimed first one: a one-step epoch) shows
'not measured' in every format, never a figure the report made from its log (issue 39 item 2: the table
showed 9.0 images/s beside a warning "summary.images_per_s: got nan"); an hf run's GPUs are those its
metrics say trained (dp on a CPU: one process, one device), not the system's count."""

import csv
import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from test_report_finetune import _summary, fine_tuning_run

from flux_cluster.report.build import Options, build
from flux_cluster.report.formats import print_tables, render_csv, render_json, render_markdown
from flux_cluster.report.html import render_html

NOTE = "not measured (only the first, compiling step ran)"
"""What the job's meter writes (flux_cluster/training/meter.py's NOT_MEASURED)."""


def _outputs(groups: list) -> dict[str, str]:
    console = Console(record=True, width=400)
    print_tables(groups, console, checked=False)
    return {
        "table": console.export_text(),
        "md": render_markdown(groups),
        "csv": render_csv(groups),
        "json": render_json(groups),
        "html": re.sub(r"<svg.*?</svg>", "", render_html(groups, checked=False), flags=re.S),  # plots' paths
    }


@pytest.mark.parametrize(
    "summary",
    [
        _summary(images_per_s=None, step_time_ms=None, throughput_note=NOTE, steps=1, samples=64),
        _summary(images_per_s=float("nan"), step_time_ms=float("nan"), steps=1, samples=64),  # 5cb611b's
    ],
    ids=["null-and-note", "nan"],
)
def test_a_run_without_a_timed_step_shows_not_measured_everywhere(tmp_path: Path, summary: dict) -> None:
    root = fine_tuning_run(tmp_path / "one-step", summaries=[summary])  # its log's block: 80 images/s
    (group,) = build([root], Options(check=False))
    (run,) = group.runs
    assert run.fine_tuning is not None and run.fine_tuning.images_per_s is None
    assert run.throughput_samples_per_s is None and group.throughput_samples_per_s is None
    note = summary.get("throughput_note", "not measured")
    assert run.fine_tuning.throughput_note == group.throughput_note == note
    assert not any("images_per_s" in w or "step_time_ms" in w for w in run.warnings), run.warnings
    assert group.cost_usd == pytest.approx(30 * 8 / 60 * 2)  # the run's time and cost still count
    out = _outputs([group])
    for name, text in out.items():
        assert "80.0" not in text and "1,000" not in text, name  # 80 images/s, its step time: the log's
        assert "not measured" in text, name
    assert "nan" not in out["table"].lower() and "nan" not in out["md"].lower()
    document = json.loads(out["json"])["groups"][0]
    assert (document["images_per_s"], document["throughput_note"]) == (None, note)
    assert document["runs"][0]["fine_tuning"]["throughput_note"] == note
    (row,) = csv.DictReader(io.StringIO(out["csv"]))
    assert (row["images_per_s"], row["throughput_samples_per_s"], row["throughput_note"]) == ("", "", note)
    if "throughput_note" in summary:
        assert NOTE in out["html"]  # the card says why, in full


def test_an_hf_run_without_a_timed_step_has_no_rates_in_its_table(tmp_path: Path) -> None:
    from hf_samples import hf_block, hf_run, hf_summary

    unmeasured = dict.fromkeys(("samples_per_s", "tokens_per_s", "tflops_per_s", "mfu", "epoch_seconds"))
    block = hf_block(**unmeasured, estimated_total_seconds=None)
    summary = hf_summary(block, images_per_s=None, step_time_ms=None, throughput_note=NOTE)
    (group,) = build([hf_run(tmp_path / "hf", summary=summary)], Options(check=False))
    out = _outputs([group])
    hf_table = out["md"].split("## Hugging Face fine-tuning")[1].split("\n\n")[1]
    assert "90.00" not in hf_table and "90.0" not in hf_table  # its last step line's, not its summary's
    assert hf_table.count("not measured") >= 3, hf_table  # samples/s, step ms, epoch, ...


def test_an_hf_runs_gpus_are_those_that_trained(tmp_path: Path) -> None:
    """dp on a CPU: one process drove one device, on a system of 2 'GPUs'; a ddp run keeps its 2."""
    from hf_samples import hf_header, hf_run, hf_summary

    dp = hf_run(
        tmp_path / "dp",
        header=hf_header(world_size=1, parallel="dp"),
        summary=hf_summary(world_size=1),
        minutes=6.0,
    )
    ddp = hf_run(tmp_path / "ddp", minutes=6.0)
    groups = {Path(g.path).parent.name: g for g in build([dp, ddp], Options(check=False))}
    one, two = groups["dp"], groups["ddp"]
    assert (one.accelerators, two.accelerators) == (1, 2)
    assert one.gpu_hours == pytest.approx(6.0 / 60) and two.gpu_hours == pytest.approx(12.0 / 60)
    assert one.cost_usd == pytest.approx(2 * 6.0 / 60)
