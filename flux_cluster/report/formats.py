"""The report as terminal tables, JSON, CSV or Markdown: the columns of each table (report/columns.py says
how a terminal shows them)."""

import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flux_cluster.atomic import finite_for_json
from flux_cluster.report.columns import (
    Column,
    format_metric,
    format_ratio,
    print_comparison,
    terminal_table,
)
from flux_cluster.report.evaluation import EVALUATIONS_ONLY, EvalResult, Latency
from flux_cluster.report.harvest import RunResult
from flux_cluster.report.hf import (
    HF_COLUMN_SPECS,
    HF_COMPARISON_NOTE,
    HF_COMPARISON_TITLE,
    HF_CSV_FIELDS,
    HF_MEASURED,
    HF_NOTE,
    HF_TITLE,
    comparisons,
    hf_document,
    hf_group_values,
    hf_rows,
)
from flux_cluster.report.ladder import LADDER_NOTE, LADDER_TITLE, LadderRow, ladder_document, ladder_rows
from flux_cluster.report.scoring import GroupResult
from flux_cluster.rundir import RESULTS_DIR
from flux_cluster.safe_text import csv_text, plain, printable

SCHEMA_VERSION = 1


def _unmeasured(note: str | None) -> str | None:
    """A table cell's short form of a summary's throughput_note (JSON, CSV and the page's card: all of it)."""
    return note.split(" (")[0] if note else None


def _group_unmeasured(group: GroupResult) -> str | None:
    return _unmeasured(group.throughput_note)


def _run_unmeasured(run: RunResult) -> str | None:
    return _unmeasured(run.fine_tuning.throughput_note if run.fine_tuning else None)


def _name(group: GroupResult) -> str:
    return group.system or Path(group.path).name


def system_label(group: GroupResult) -> str:
    """The system as the summary table names it: its folder, and its systems JSON's system_name (the
    official summarizer's name) where that differs."""
    name = _name(group)
    return f"{name} ({group.system_name})" if group.system_name and group.system_name != name else name


def olympic_text(group: GroupResult) -> str | None:
    """The olympic minutes, and the RCP scaling factor (scaling.json) beside a scaled one."""
    if group.olympic_minutes is None:
        return None
    if group.scaling_factor == 1.0:
        return f"{group.olympic_minutes:.2f}"
    return f"{group.olympic_minutes:.2f} (x{group.scaling_factor:g} RCP)"


def ruleset_text(group: GroupResult) -> str:
    """The ruleset a group was checked under, and where it came from."""
    source = "assumed: give --ruleset" if group.ruleset_from == "assumed" else f"from {group.ruleset_from}"
    return (
        f"ruleset {group.ruleset or '?'} ({source})"
        if group.ruleset_from
        else f"ruleset {group.ruleset or '?'}"
    )


def _runs(group: GroupResult) -> str:
    return f"{group.scored_runs}/{group.run_count}"


def evaluations_only(group: GroupResult) -> bool:
    """A group of flux-cluster evaluate results outside a run: no runs, no training figures."""
    return group.benchmark == EVALUATIONS_ONLY and not group.runs


EVALUATIONS_ONLY_MODE = "eval only"
"""The side-by-side table's mode for a group of evaluations alone."""


def mlperf_groups(groups: list[GroupResult]) -> list[GroupResult]:
    """The groups of the MLPerf summary table: runs that are not fine-tuning."""
    return [g for g in groups if not g.fine_tuning and not evaluations_only(g)]


GROUP_COLUMNS = [
    Column("system", system_label),
    Column("benchmark", lambda g: g.benchmark, terminal=False, page=False),  # the cards say it
    Column("accelerators", lambda g: g.accelerators),
    Column("runs scored", _runs),
    Column("olympic minutes", olympic_text),
    Column("mean minutes", lambda g: g.mean_minutes, "{:.2f}", terminal=False),
    Column(
        "minutes range",
        lambda g: (g.min_minutes, g.max_minutes) if g.min_minutes is not None else None,
        "{0[0]:.2f}..{0[1]:.2f}",
        terminal=False,
    ),
    Column("samples to converge", lambda g: g.samples_to_converge, "{:,.0f}"),
    Column("RCP", lambda g: g.rcp_verdict),  # what mlperf_logging's RCP checker says of the runs
    Column("samples/s", lambda g: g.throughput_samples_per_s, "{:,.1f}", terminal=False),
    Column("samples/s/acc", lambda g: g.throughput_per_accelerator, "{:,.2f}"),
    Column("MFU", lambda g: g.mfu, "{:.1%}"),
    Column("GPU-hours per run", lambda g: g.gpu_hours, "{:,.2f}"),
    Column("USD per run", lambda g: g.cost_usd, "{:,.2f}"),
    # per run at the olympic or the mean measured time
    Column("basis", lambda g: g.minutes_basis, terminal=False),
    Column("GPU-hours all runs", lambda g: g.total_gpu_hours, "{:,.2f}", terminal=False, page=False),
    # the page's cards say it
    Column("USD all runs", lambda g: g.total_cost_usd, "{:,.2f}", terminal=False, page=False),
    Column("mode", lambda g: g.train_mode, terminal=False, page=False),
    Column("ruleset", lambda g: g.ruleset, terminal=False, page=False),  # the titles and cards say it
]
GROUP_PRIORITY = (
    "system", "olympic minutes", "USD per run", "samples/s/acc", "runs scored", "accelerators",
    "samples to converge", "RCP", "MFU", "GPU-hours per run",
)  # fmt: skip
"""The terminal's summary columns, the most important first: a narrow window drops them from the last."""


def run_name(group: GroupResult) -> str:
    """The run directory's name for a flux-cluster run (several runs on one system differ by it), else
    the folder of the group's result files."""
    path = Path(group.path)
    return path.parent.name if path.name == RESULTS_DIR and path.parent.name else path.name


THROUGHPUT_NOTE = (
    "images/s and samples/s: the measured training steps alone, evaluation and each attempt's first step "
    "(compile) excluded (a log without a metrics summary: its training blocks, evaluation excluded)"
)
FINE_TUNING_TITLE = "Fine-tuning, side by side"
FINE_TUNING_NOTE = (
    "No olympic score (no MLPerf result): minutes are the mean measured run time, GPU-hours and USD per "
    "run at that time, USD all runs for every timed run; losses and images/s are means over runs, peak "
    "memory the most; inference p50/p99 (seconds per image, the fine-tuned model's where measured) and "
    "CLIP scores are means over the run's flux-cluster evaluate results, * when they are not meaningful; "
    f"mode {EVALUATIONS_ONLY_MODE}: evaluations outside a run (a pipeline alone, a LoRA file), one group per "
    "system they record (evaluate --system), inference and CLIP figures only; cheapest first; "
    + THROUGHPUT_NOTE
)
FINE_TUNING_COLUMNS = [
    Column("system", _name),
    Column("run", run_name, page=False),  # the page's row heading names it
    Column("mode", lambda g: EVALUATIONS_ONLY_MODE if evaluations_only(g) else g.train_mode),
    Column("accelerators", lambda g: g.accelerators),
    Column("GPU", lambda g: g.accelerator_model, terminal=False, page=False),
    Column("runs", lambda g: None if evaluations_only(g) else g.run_count, terminal=False),
    Column("minutes", lambda g: g.mean_minutes, "{:.2f}"),
    Column("images/s", lambda g: g.throughput_samples_per_s, "{:,.1f}", missing=_group_unmeasured),
    Column(
        "images/s/GPU",
        lambda g: g.throughput_per_accelerator,
        "{:,.2f}",
        terminal=False,
        missing=_group_unmeasured,
    ),
    Column("step ms", lambda g: g.step_time_ms, "{:,.0f}", terminal=False, missing=_group_unmeasured),
    Column("best val loss", lambda g: g.best_eval_loss, "{:.4f}"),
    Column("final val loss", lambda g: g.final_eval_loss, "{:.4f}", terminal=False),
    Column("peak GB", lambda g: g.peak_memory_gb, "{:,.1f}", terminal=False, page=False),
    Column("GPU-hours per run", lambda g: g.gpu_hours, "{:,.2f}", terminal=False),
    Column("USD per run", lambda g: g.cost_usd, "{:,.2f}"),
    Column("USD all runs", lambda g: g.total_cost_usd, "{:,.2f}", terminal=False),
    Column("basis", lambda g: g.minutes_basis, terminal=False),
    # flux-cluster evaluate's figures (issue 15): inference speed and quality beside training and cost
    Column("p50 s", lambda g: _evaluated(g, g.inference_p50_s), "{}"),
    Column("p99 s", lambda g: _evaluated(g, g.inference_p99_s), "{}", terminal=False),
    Column("USD per 1k images", lambda g: _evaluated(g, g.inference_usd_per_1k_images), "{}", terminal=False),
    Column("CLIP base", lambda g: _evaluated(g, g.clip_score_base), "{}", terminal=False),
    Column("CLIP tuned", lambda g: _evaluated(g, g.clip_score_tuned), "{}"),
]
FINE_TUNING_PRIORITY = (
    "system", "run", "USD per run", "images/s", "best val loss", "minutes", "mode", "accelerators", "p50 s",
    "CLIP tuned",
)  # fmt: skip


def _evaluated(group: GroupResult, value: float | None) -> str | None:
    """An evaluation figure to 4 significant digits, starred when its evaluations are not meaningful."""
    if value is None:
        return None
    return f"{value:.4g}" + ("" if group.evals_meaningful else "*")


def _latency(side: str, key: str) -> Callable[[EvalResult], float | None]:
    def value(result: EvalResult) -> float | None:
        latency: Latency | None = getattr(result, side)
        return getattr(latency, key) if latency else None

    return value


def _meaningful(result: EvalResult) -> str:
    if result.meaningful:
        return "yes"
    return "NO" + (f": {result.meaningful_reason}" if result.meaningful_reason else "")


EVAL_TITLE = "Evaluations"
EVAL_NOTE = (
    "flux-cluster evaluate: latency in seconds per image over the timed generations, for the base and the "
    "fine-tuned (tuned) model in the same process; CLIP scores of their images against the prompts"
)
EVAL_COLUMNS = [
    Column("eval", lambda e: e.name),
    Column("meaningful", _meaningful, wrap=True),
    Column("system", lambda e: e.system, terminal=False, page=False),  # the page's heading names it
    Column("device", lambda e: e.device, terminal=False, wrap=True),
    Column("model", lambda e: e.model, terminal=False, wrap=True),
    Column("weights", lambda e: e.weights_kind, terminal=False),
    Column("base", lambda e: e.base_precision),
    Column("steps", lambda e: e.settings.get("steps"), terminal=False),
    Column("resolution", lambda e: e.settings.get("resolution"), terminal=False),
    Column("p50 s base", _latency("base", "p50_s"), "{:.4g}"),
    Column("p50 s tuned", _latency("tuned", "p50_s"), "{:.4g}"),
    Column("p90 s base", _latency("base", "p90_s"), "{:.4g}", terminal=False),
    Column("p90 s tuned", _latency("tuned", "p90_s"), "{:.4g}", terminal=False),
    Column("p99 s base", _latency("base", "p99_s"), "{:.4g}", terminal=False),
    Column("p99 s tuned", _latency("tuned", "p99_s"), "{:.4g}", terminal=False),
    Column("images/s base", _latency("base", "images_per_s"), "{:.4g}", terminal=False),
    Column("images/s tuned", _latency("tuned", "images_per_s"), "{:.4g}", terminal=False),
    Column("peak GB base", _latency("base", "peak_memory_gb"), "{:,.1f}", terminal=False),
    Column("peak GB tuned", _latency("tuned", "peak_memory_gb"), "{:,.1f}", terminal=False),
    Column("CLIP base", lambda e: e.clip_base, "{:.4g}"),
    Column("CLIP tuned", lambda e: e.clip_tuned, "{:.4g}"),
    Column("val loss base", lambda e: e.val_loss_base, "{:.4f}"),
    Column("val loss tuned", lambda e: e.val_loss_tuned, "{:.4f}"),
]
EVAL_PRIORITY = (
    "eval", "p50 s tuned", "CLIP tuned", "meaningful", "p50 s base", "CLIP base", "val loss tuned",
    "val loss base", "base",
)  # fmt: skip


def _tuned(name: str) -> Callable[[Any], Any]:
    return lambda run: getattr(run.fine_tuning, name) if run.fine_tuning is not None else None


FINE_TUNING_RUN_COLUMNS = [
    Column("run", lambda r: Path(r.file).name),
    Column("status", lambda r: r.status),
    Column("minutes", lambda r: r.minutes, "{:.2f}"),
    Column("evals", lambda r: len(r.fine_tuning.curve) if r.fine_tuning else r.evals, terminal=False),
    Column("best val loss", _tuned("best_eval_loss"), "{:.4f}"),
    Column("best step", _tuned("best_step"), "{:,}", terminal=False),
    Column("final val loss", _tuned("final_eval_loss"), "{:.4f}"),
    Column("epochs", _tuned("epochs"), "{:g}"),
    Column("steps", _tuned("steps"), "{:,}", terminal=False),
    Column("images/s", lambda r: r.throughput_samples_per_s, "{:,.1f}", missing=_run_unmeasured),
    Column("step ms", _tuned("step_time_ms"), "{:,.0f}", missing=_run_unmeasured),
    Column("peak GB", _tuned("peak_memory_gb"), "{:,.1f}"),
    Column("optimizer", _tuned("optimizer"), terminal=False),
    Column(
        "summary",
        lambda r: None if r.fine_tuning is None else "yes" if r.fine_tuning.summary else "no",
        terminal=False,
    ),
    Column("best weights", _tuned("best_weights"), terminal=False, wrap=True),
]
FINE_TUNING_RUN_PRIORITY = (
    "run", "status", "best val loss", "minutes", "images/s", "final val loss", "peak GB", "step ms", "epochs",
)  # fmt: skip


HF_COLUMNS = [
    Column(*spec, missing=(lambda r: _run_unmeasured(r.run)) if spec[0] in HF_MEASURED else None)
    for spec in HF_COLUMN_SPECS
]
"""The hf runs' table (report.hf.HF_COLUMN_SPECS)."""
HF_PRIORITY = (
    "run", "samples/s", "est. USD", "MFU", "parallel", "precision", "mode", "GPUs", "peak GB", "est. total",
    "step ms", "tokens/s", "mbs", "TFLOP/s/GPU", "est. GPU-h", "epoch", "FLOPs/step", "model",
)  # fmt: skip


LADDER_COLUMNS = [
    Column("precision", lambda r: r.precision),
    Column("run", lambda r: run_name(r.group), wrap=True),
    Column("train GB", lambda r: r.train_memory_gb, "{:,.2f}"),
    Column("params GB", lambda r: r.parameter_gb, "{:,.3g}", terminal=False),
    Column("inference GB", lambda r: r.inference_memory_gb, "{:,.2f}"),
    Column("images/s", lambda r: r.images_per_s, "{:,.1f}"),
    Column("final val loss", lambda r: r.final_eval_loss, "{:.4f}"),
    Column("CLIP score", lambda r: r.clip_score, "{:.2f}"),
    Column("meaningful", lambda r: "yes" if r.meaningful else f"no: {r.device or 'cpu'}"),
]
"""The precision ladder (report/ladder.py): seed 004's precision | train VRAM | inference VRAM | speed |
quality."""
LADDER_PRIORITY = (
    "precision", "run", "train GB", "inference GB", "images/s", "final val loss", "CLIP score", "meaningful",
)  # fmt: skip


def ladder_markdown(groups: list[GroupResult]) -> list[str]:
    """The precision ladder as Markdown lines (none without one)."""
    rows: list[LadderRow] = ladder_rows(groups)
    if not rows:
        return []
    return ["", f"## {LADDER_TITLE}", "", *_md_table(LADDER_COLUMNS, rows), "", LADDER_NOTE + "."]


def run_columns(group: GroupResult) -> list[Column]:
    return FINE_TUNING_RUN_COLUMNS if group.fine_tuning else RUN_COLUMNS


def by_cost(groups: list[GroupResult]) -> list[GroupResult]:
    """The groups side by side (fine-tuning, or evaluated), cheapest run first (unknown cost last)."""
    tuned = [g for g in groups if g.fine_tuning or g.evals]
    return sorted(tuned, key=lambda g: (g.cost_usd is None, g.cost_usd or 0.0, _name(g)))


RUN_COLUMNS = [
    Column("run", lambda r: Path(r.file).name),
    Column("status", lambda r: r.status),
    Column("minutes", lambda r: r.minutes, "{:.2f}"),
    Column("scored", lambda r: "yes" if r.scored else "no"),
    Column("samples to converge", lambda r: r.samples_to_converge, "{:,}"),
    Column("final eval", lambda r: r.final_eval_loss, "{:.4f}"),
    Column("GBS", lambda r: r.global_batch_size, terminal=False),
    Column("LR", lambda r: r.learning_rate, "{:g}", terminal=False),
    Column("warmup", lambda r: r.warmup_steps, terminal=False),
    Column("evals", lambda r: r.evals, terminal=False),
    Column("eval minutes", lambda r: r.eval_minutes, "{:.2f}", terminal=False),
    Column("samples/s", lambda r: r.throughput_samples_per_s, "{:,.1f}", terminal=False),
    Column("samples/s/acc", lambda r: r.throughput_per_accelerator, "{:,.2f}"),
    Column("compliance", lambda r: r.compliance),
]
RUN_PRIORITY = (
    "run", "minutes", "status", "scored", "compliance", "samples to converge", "final eval", "samples/s/acc",
)  # fmt: skip


def to_document(groups: list[GroupResult], comparison: dict[str, Any] | None = None) -> dict[str, Any]:
    document: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "groups": [g.to_json() for g in groups]}
    if comparison is not None:
        document["comparison"] = comparison
    hf = hf_document(groups)
    if hf is not None:
        document["hf"] = hf
    ladder = ladder_document(groups)
    if ladder is not None:
        document["precision_ladder"] = ladder
    return document


def render_json(groups: list[GroupResult], comparison: dict[str, Any] | None = None) -> str:
    return json.dumps(finite_for_json(to_document(groups, comparison)), indent=2, allow_nan=False) + "\n"


CSV_FIELDS = [
    "path", "benchmark", "system", "submitter", "accelerator_model", "accelerators", "ruleset",
    "olympic_minutes", "mean_minutes", "min_minutes", "max_minutes", "run_count", "scored_runs",
    "samples_to_converge", "gpu_hours", "price_per_gpu_hour", "cost_usd", "throughput_samples_per_s",
    "throughput_per_accelerator", "mfu", "train_mode", "minutes_basis", "total_gpu_hours", "total_cost_usd",
    "images_per_s", "images_per_s_per_accelerator", "step_time_ms", "best_eval_loss", "final_eval_loss",
    "peak_memory_gb", "inference_p50_s", "inference_p99_s", "inference_images_per_s",
    "inference_usd_per_1k_images", "clip_score_base", "clip_score_tuned", "val_loss_base", "val_loss_tuned",
    "evals_meaningful", "scaling_factor", "system_name", "ruleset_from", "rcp_verdict", "throughput_note",
]  # fmt: skip


def render_csv(groups: list[GroupResult]) -> str:
    """One row per group, the JSON names as headers (full precision, for spreadsheets and scripts)."""
    hf = bool(hf_rows(groups))  # the hf columns only where there are hf runs: other reports keep theirs
    rows = [
        {name: getattr(group, name) for name in CSV_FIELDS} | (hf_group_values(group) if hf else {})
        for group in groups
    ]
    return csv_text(rows, CSV_FIELDS + (HF_CSV_FIELDS if hf else []))


# Markdown renders inline HTML, links and emphasis; these characters become entities so a cell or line
# shows as text and a pipe cannot split a table cell. Control characters are spelled out (printable).
_MD_ENTITIES = str.maketrans({c: f"&#{ord(c)};" for c in "\\`|[]*"})


def _md(text: Any) -> str:
    # an apostrophe stays readable (no tag can open: < is escaped); a double quote is still spelled out
    return html.escape(printable(str(text)), quote=False).replace('"', "&quot;").translate(_MD_ENTITIES)


def _md_table(columns: list[Column], rows: list[Any]) -> list[str]:
    lines = ["| " + " | ".join(c.header for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_md(c.text(row)) for c in columns) + " |")
    return lines


def render_markdown(groups: list[GroupResult], comparison: dict[str, Any] | None = None) -> str:
    lines = ["# flux-cluster report"]
    mlperf, tuned = mlperf_groups(groups), by_cost(groups)
    if mlperf or not tuned:
        lines += ["", *_md_table(GROUP_COLUMNS, mlperf)]
    if tuned:
        lines += ["", f"## {FINE_TUNING_TITLE}", "", *_md_table(FINE_TUNING_COLUMNS, tuned)]
        lines += ["", FINE_TUNING_NOTE + "."]
    lines += hf_markdown(groups)
    lines += ladder_markdown(groups)
    for group in groups:
        lines += ["", f"## {_md(_name(group))} ({_md(group.benchmark)})", "", f"path: {_md(group.path)}", ""]
        if not group.fine_tuning and not evaluations_only(group):
            lines[-1:-1] = [f"{_md(ruleset_text(group))}", ""]
        lines += [] if evaluations_only(group) else _md_table(run_columns(group), group.runs)
        if group.evals:
            lines += ["", f"### {EVAL_TITLE}", "", *_md_table(EVAL_COLUMNS, group.evals), ""]
            lines += [EVAL_NOTE + ".", ""]
        lines += [f"- warning: {_md(w)}" for w in all_warnings(group)]
    if comparison is not None:
        lines += ["", *comparison_markdown(comparison)]
    return "\n".join(lines) + "\n"


def all_warnings(group: GroupResult) -> list[str]:
    """The group's warnings, then each run's, prefixed with the run's file name."""
    out = list(group.warnings)
    for run in group.runs:
        out += [f"{Path(run.file).name}: {w}" for w in run.warnings]
        if run.compliance == "failed":
            first = run.compliance_messages[0] if run.compliance_messages else "see the checker"
            out.append(f"{Path(run.file).name}: compliance failed: {first}")
    return out


def _batch_line(group: GroupResult) -> str:
    settings = sorted({(r.global_batch_size, r.learning_rate, r.warmup_steps) for r in group.runs}, key=str)
    return "; ".join(
        f"GBS {b or '-'}, LR {lr if lr is not None else '-'}, warmup {w if w is not None else '-'}"
        for b, lr, w in settings
    )


def _unscored(row: Any) -> bool:
    return isinstance(row, RunResult) and not row.scored and row.fine_tuning is None


def print_tables(groups: list[GroupResult], console: Any, checked: bool, wide: bool = False) -> None:
    from rich.text import Text

    def table(title: Any, columns: list[Column], rows: list[Any], left: tuple[str, ...], rank: tuple) -> None:
        terminal_table(console, title, columns, rows, left=left, priority=rank, wide=wide, dim=_unscored)

    for group in groups:
        title = f"{_name(group)} ({group.benchmark or '?'}): {group.path}"
        if not evaluations_only(group):
            facts = (
                _batch_line(group) if group.fine_tuning else f"{ruleset_text(group)}; {_batch_line(group)}"
            )
            heading = Text.assemble(plain(title), "\n", facts)
            rank = FINE_TUNING_RUN_PRIORITY if group.fine_tuning else RUN_PRIORITY
            table(heading, run_columns(group), group.runs, ("run", "status", "best weights"), rank)
        if group.evals:
            title = Text.assemble(
                f"{EVAL_TITLE}: ", plain(title if evaluations_only(group) else _name(group))
            )
            table(
                title, EVAL_COLUMNS, group.evals, ("eval", "meaningful", "device", "weights"), EVAL_PRIORITY
            )
        for warning in all_warnings(group):
            console.print(Text.assemble(("warning:", "yellow"), " ", plain(warning)), soft_wrap=True)
    mlperf, tuned = mlperf_groups(groups), by_cost(groups)
    if tuned:
        left = ("system", "run", "mode", "basis")
        table(FINE_TUNING_TITLE, FINE_TUNING_COLUMNS, tuned, left, FINE_TUNING_PRIORITY)
        console.print(FINE_TUNING_NOTE + ".", soft_wrap=True)
    rows = hf_rows(groups)
    if rows:
        table(HF_TITLE, HF_COLUMNS, rows, ("run", "model", "parallel", "precision", "mode"), HF_PRIORITY)
        console.print(HF_NOTE + ".", soft_wrap=True)
        pairs = comparisons(rows)
        if pairs:
            console.print(HF_COMPARISON_TITLE + ": " + HF_COMPARISON_NOTE + ".", soft_wrap=True)
            print_comparison({"pairs": pairs, "unmatched": []}, console)
    ladder = ladder_rows(groups)
    if ladder:
        table(LADDER_TITLE, LADDER_COLUMNS, ladder, ("precision", "run", "meaningful"), LADDER_PRIORITY)
        console.print(LADDER_NOTE + ".", soft_wrap=True)
    if mlperf or not tuned:
        rules = "as MLPerf's result_summarizer" if checked else "summarizer rules; compliance not checked"
        rulesets = ", ".join(dict.fromkeys(ruleset_text(g) for g in mlperf)) or "no ruleset"
        title = f"flux-cluster report (olympic scores {rules}; {rulesets})"
        table(title, GROUP_COLUMNS, mlperf, ("system", "basis"), GROUP_PRIORITY)


def comparison_markdown(comparison: dict[str, Any]) -> list[str]:
    lines = [f"# Comparison: A = {_md(comparison['a'])}, B = {_md(comparison['b'])}"]
    for pair in comparison["pairs"]:
        lines += [
            "",
            f"## {_md(pair['a_name'])} vs {_md(pair['b_name'])}",
            "",
            "| metric | A | B | B/A |",
            "|---|---|---|---|",
        ]
        for m in pair["metrics"]:
            cells = (m["name"], format_metric(m, "a"), format_metric(m, "b"), format_ratio(m["ratio"]))
            lines.append("| " + " | ".join(cells) + " |")
    lines += [f"- unmatched: {_md(u)}" for u in comparison["unmatched"]]
    return lines


def hf_markdown(groups: list[GroupResult]) -> list[str]:
    """The hf runs side by side and seed 002's comparisons, as Markdown lines (none without hf runs)."""
    rows = hf_rows(groups)
    if not rows:
        return []
    lines = ["", f"## {HF_TITLE}", "", *_md_table(HF_COLUMNS, rows), "", HF_NOTE + "."]
    pairs = comparisons(rows)
    if pairs:
        lines += ["", f"## {HF_COMPARISON_TITLE}", "", HF_COMPARISON_NOTE + "."]
        lines += comparison_markdown({"a": "", "b": "", "pairs": pairs, "unmatched": []})[1:]
    return lines
