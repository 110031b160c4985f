"""The report's precision ladder (issue 29, seed 004's table): LoRA runs that differ in
train.base_precision side by side with their train and inference memory, speed and quality, in every
format; CPU runs marked meaningless for GPUs; no ladder from runs of one precision. The run folders are
written as the training loop and evaluate write them (test_report_finetune's and report_samples')."""

import io
import json
from pathlib import Path
from typing import Any

from report_samples import _latency, eval_document
from rich.console import Console
from test_report_finetune import _summary, fine_tuning_run

from flux_cluster.report.build import Options, build
from flux_cluster.report.formats import LADDER_TITLE, print_tables, render_json, render_markdown
from flux_cluster.report.html import render_html
from flux_cluster.report.ladder import ladder_rows

FIGURES = {  # precision: (peak train GB, parameter GB, images/s, final loss, inference GB, CLIP)
    "nf4": (14.0, 3.4, 80.0, 0.49, 7.5, 30.5),
    "bf16": (30.0, 12.0, 100.0, 0.47, 24.0, 31.5),
    "fp8": (20.0, 6.0, 90.0, 0.48, 13.0, 31.0),
}


def rung(root: Path, precision: str, gpu: str = "H100", **summary: Any) -> Path:
    train_gb, param_gb, speed, loss, infer_gb, clip = FIGURES[precision]
    changes = {"base_precision": precision, "parameter_gb": param_gb, "peak_memory_gb": train_gb}
    changes |= {"images_per_s": speed, "final_eval_loss": loss, **summary}
    run = fine_tuning_run(root / precision, summaries=[_summary(**changes)])
    config = json.loads((run / "config.yaml").read_text())
    config["system"]["gpu_model"] = gpu
    (run / "config.yaml").write_text(json.dumps(config))
    latency = {"base": _latency(0.5), "tuned": _latency(0.6, peak_memory_gb=infer_gb)}
    document = eval_document(latency=latency, clip_score={"base": 30.0, "tuned": clip, "clip_model": "c"})
    (run / "results" / "eval_0.json").write_text(json.dumps({**document, "grid": None}))
    return run


def test_runs_of_three_base_precisions_stand_side_by_side_in_every_format(tmp_path: Path) -> None:
    for precision in FIGURES:
        rung(tmp_path, precision)
    groups = build([tmp_path], Options(check=False))
    rows = ladder_rows(groups)
    assert [r.precision for r in rows] == ["bf16", "fp8", "nf4"]  # the ladder's order, not the folders'
    for row in rows:
        train_gb, param_gb, speed, loss, infer_gb, clip = FIGURES[row.precision]
        assert (row.train_memory_gb, row.parameter_gb, row.images_per_s) == (train_gb, param_gb, speed)
        assert (row.final_eval_loss, row.inference_memory_gb, row.clip_score) == (loss, infer_gb, clip)
        assert row.meaningful
    ladder = json.loads(render_json(groups))["precision_ladder"]
    assert [r["precision"] for r in ladder["rows"]] == ["bf16", "fp8", "nf4"]
    assert ladder["rows"][2]["inference_memory_gb"] == 7.5
    markdown = render_markdown(groups)
    assert (
        f"## {LADDER_TITLE}" in markdown
        and "| nf4 | nf4 | 14.00 | 3.4 | 7.50 | 80.0 | 0.4900 | 30.50 |" in markdown
    )
    assert 'id="precision-ladder"' in render_html(groups, checked=False)
    out = io.StringIO()
    print_tables(groups, Console(file=out, width=200), checked=False)
    # GPU rungs: every row meaningful (LADDER_NOTE says "meaningless" whatever the rows are)
    ladder = out.getvalue()[out.getvalue().index(LADDER_TITLE) :]
    assert "no: " not in ladder and ladder.count("│ yes ") == 3


def test_cpu_rungs_are_marked_and_one_precision_makes_no_ladder(tmp_path: Path) -> None:
    rung(tmp_path / "one", "bf16")
    assert ladder_rows(build([tmp_path / "one"], Options(check=False))) == []
    assert "precision_ladder" not in json.loads(render_json(build([tmp_path / "one"], Options(check=False))))
    rung(tmp_path / "cpu", "fp8", gpu="cpu")
    rung(tmp_path / "cpu", "nf4", gpu="cpu")
    rows = ladder_rows(build([tmp_path / "cpu"], Options(check=False)))
    assert [(r.precision, r.meaningful) for r in rows] == [("fp8", False), ("nf4", False)]
    assert "| no: cpu |" in render_markdown(build([tmp_path / "cpu"], Options(check=False)))
    out = io.StringIO()
    print_tables(build([tmp_path / "cpu"], Options(check=False)), Console(file=out, width=200), checked=False)
    ladder = out.getvalue()[out.getvalue().index(LADDER_TITLE) :]
    assert ladder.count("│ no: cpu ") == 2  # the per-row marker, not only the note
