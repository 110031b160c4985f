"""The report as one self-contained HTML page: tables, warnings and inline SVG plots, no scripts.

The page leads with the answers, one card per group (time to train, cost, samples/s per accelerator,
MFU or, for fine-tuning, the best validation loss; each with how it was obtained), then the summary
table of the MLPerf groups, the fine-tuning (or evaluated) groups side by side, each evaluation with
its sample grid (a PNG inlined as a data: URI), the plots and every run. It fits a
1,400 px window without sideways scrolling.
"""

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flux_cluster.report import formats, plots
from flux_cluster.report.columns import format_metric, format_ratio
from flux_cluster.report.hf import comparisons, hf_rows
from flux_cluster.report.ladder import ladder_rows
from flux_cluster.report.scoring import GroupResult
from flux_cluster.safe_text import CONTROL, printable

if TYPE_CHECKING:
    import jinja2

_CONTROL_BUT_SPACE = re.compile(f"(?![\\t\\n\\r]){CONTROL.pattern}")


@dataclass(frozen=True)
class Answer:
    """One answer: what it is, its value ('-' when unknown) and how it was obtained (or why not)."""

    label: str
    value: str
    how: str


@dataclass(frozen=True)
class Card:
    name: str
    anchor: str
    about: str
    answers: list[Answer]
    warnings: int


def _time(group: GroupResult) -> Answer:
    if group.olympic_minutes is not None:
        how = f"olympic score of {group.scored_runs}/{group.run_count} runs, as MLPerf's result_summarizer"
        if group.scaling_factor != 1.0:
            how += f", times the RCP scaling factor {group.scaling_factor:g} (scaling.json)"
        return Answer("Time to train", f"{group.olympic_minutes:,.2f} min", how)
    measured = [r.minutes for r in group.runs if r.minutes is not None]
    if not measured:
        return Answer("Time to train", "-", "no run has both run_start and run_stop")
    why = "fine-tuning has no olympic score" if group.fine_tuning else "no olympic score (see its warnings)"
    mean = sum(measured) / len(measured)
    return Answer("Run time (measured)", f"{mean:,.2f} min", f"mean of {len(measured)} run(s); {why}")


def _cost(group: GroupResult) -> Answer:
    if group.gpu_hours is None:
        why = "accelerator count unknown" if not group.accelerators else "no run time"
        return Answer("Cost per run", "-", why)
    at = "the olympic time as measured" if group.minutes_basis == "olympic" else "the mean measured time"
    if group.cost_usd is None or group.price_per_gpu_hour is None:
        how = f"{group.gpu_hours:,.2f} GPU-h at {at}; no price (--price or the system's price_per_gpu_hour)"
        return Answer("Cost per run", "-", how)
    how = f"{group.gpu_hours:,.2f} GPU-h x ${group.price_per_gpu_hour:,.2f}, at {at}"
    if group.run_count > 1 and group.total_cost_usd is not None:
        how += f"; all timed runs: ${group.total_cost_usd:,.2f}"
    return Answer("Cost per run", f"${group.cost_usd:,.2f}", how)


def _throughput(group: GroupResult) -> Answer:
    label, unit = (
        ("Images/s per GPU", "images/s") if group.fine_tuning else ("Samples/s per accelerator", "samples/s")
    )
    if group.throughput_per_accelerator is None or group.throughput_samples_per_s is None:
        return Answer(label, "-", plots.no_throughput(group))
    alone = "no evaluation, no first-step compile" if group.fine_tuning else "its logs' training blocks"
    how = (
        f"{group.throughput_samples_per_s:,.1f} {unit} on {group.accelerators}, mean over its runs; "
        f"training steps alone ({alone})"
    )
    return Answer(label, f"{group.throughput_per_accelerator:,.2f}", how)


def _mfu(group: GroupResult) -> Answer:
    if group.mfu is None:
        return Answer("MFU", "-", "needs the model FLOPs per sample and the bf16 peak (--peak-tflops)")
    return Answer("MFU", f"{group.mfu:.1%}", "model FLOP/s per accelerator / its bf16 peak")


def _validation(group: GroupResult) -> Answer:
    label = "Best validation loss"
    if group.best_eval_loss is None:
        return Answer(label, "-", "no evaluation in its metrics files or logs")
    final = "-" if group.final_eval_loss is None else f"{group.final_eval_loss:.4f}"
    return Answer(label, f"{group.best_eval_loss:.4f}", f"mean over its runs; final {final}")


def _evaluations_how(group: GroupResult) -> str:
    how = f"mean of {len(group.evals)} evaluation(s), the fine-tuned model's where measured"
    return how if group.evals_meaningful else "NOT MEANINGFUL (see the evaluations); " + how


def _inference_alone(group: GroupResult) -> list[Answer]:
    """A group of evaluations alone (no runs): its latency, throughput and quality, nothing of training."""
    how = _evaluations_how(group)
    memory = [x.peak_memory_gb for e in group.evals if (x := e.latency) and x.peak_memory_gb is not None]

    def figure(value: float | None, unit: str = "") -> str:
        return "-" if value is None else f"{value:.3g}{unit}"

    return [
        Answer(
            "Inference p50 / p99", f"{figure(group.inference_p50_s)} / {figure(group.inference_p99_s)} s", how
        ),
        Answer(
            "Images/s",
            figure(group.inference_images_per_s),
            "peak memory " + (f"{max(memory):,.1f} GB" if memory else "not measured"),
        ),
        Answer(
            "USD per 1,000 images",
            figure(group.inference_usd_per_1k_images),
            "one accelerator at "
            + ("no price" if group.price_per_gpu_hour is None else f"${group.price_per_gpu_hour:g}/GPU-hour"),
        ),
        Answer("CLIP score base", figure(group.clip_score_base), "mean over its evaluations"),
        Answer("CLIP score tuned", figure(group.clip_score_tuned), "where fine-tuned weights were evaluated"),
    ]


def _inference(group: GroupResult) -> Answer:
    label = "Inference p50 / CLIP"
    p50, clip = group.inference_p50_s, group.clip_score_tuned
    if clip is None:
        clip = group.clip_score_base
    value = f"{'-' if p50 is None else f'{p50:.3g} s'} / {'-' if clip is None else f'{clip:.3g}'}"
    return Answer(label, value, _evaluations_how(group))


def cards(groups: list[GroupResult]) -> list[Card]:
    out = []
    for index, (group, name) in enumerate(zip(groups, plots.names(groups), strict=True)):
        warnings = len(formats.all_warnings(group))
        if formats.evaluations_only(group):
            about = "flux-cluster evaluate outside a run: inference only" + (
                f", on {group.accelerator_model}" if group.accelerator_model else ""
            )
            out.append(Card(name, f"group-{index}", about, _inference_alone(group), warnings))
            continue
        about = [group.benchmark or "unknown benchmark"]
        if group.system_name:
            about.append(group.system_name)  # the official summarizer's name for the system
        if not group.fine_tuning and group.ruleset_from:
            about.append(formats.ruleset_text(group))
        if group.fine_tuning:
            about.append(f"fine-tuning ({group.train_mode}): no MLPerf result")
        if group.accelerators:
            about.append(f"{group.accelerators} x {group.accelerator_model or 'accelerator'}")
        last = _validation(group) if group.fine_tuning else _mfu(group)  # what a fine-tuner compares
        answers = [_time(group), _cost(group), _throughput(group), last]
        if group.evals:
            answers.append(_inference(group))
        out.append(Card(name, f"group-{index}", ", ".join(about), answers, warnings))
    return out


def template(name: str) -> "jinja2.Template":
    """A page template of flux_cluster/report/templates, every value HTML-escaped unless marked safe."""
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("flux_cluster.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        finalize=_shown,
    )
    return environment.get_template(name)


def _shown(value: Any) -> Any:
    """Every value a page shows, before it is escaped: control characters (ESC, BEL, bidi) from names and
    captions spelled out (\\x1b) as the terminal and Markdown show them; markup made safe (the plots' SVG,
    a joined list) keeps its line breaks and tabs."""
    from markupsafe import Markup

    if isinstance(value, Markup):
        return Markup(_CONTROL_BUT_SPACE.sub(lambda m: printable(m.group()), value))
    if value is None or isinstance(value, int | float):
        return value
    return printable(str(value))


def render_html(groups: list[GroupResult], checked: bool, comparison: dict[str, Any] | None = None) -> str:
    from flux_cluster import __version__

    answers = cards(groups)
    rows = hf_rows(groups)
    card_of = {id(g): c for g, c in zip(groups, answers, strict=True)}
    return template("report.html.j2").render(
        groups=groups,
        cards=answers,
        summary_rows=[(g, card_of[id(g)]) for g in formats.mlperf_groups(groups)],
        fine_rows=[(g, card_of[id(g)]) for g in formats.by_cost(groups)],
        fine_columns=[c for c in formats.FINE_TUNING_COLUMNS if c.page],
        evaluated=[(g, card_of[id(g)]) for g in groups if g.evals],
        eval_columns=[c for c in formats.EVAL_COLUMNS if c.page],
        eval_title=formats.EVAL_TITLE,
        eval_note=formats.EVAL_NOTE,
        fine_title=formats.FINE_TUNING_TITLE,
        hf_rows=rows,
        hf_columns=[c for c in formats.HF_COLUMNS if c.terminal],  # the page fits 1,400 px as the terminal
        hf_pairs=comparisons(rows),
        hf_title=formats.HF_TITLE,
        hf_note=formats.HF_NOTE,
        hf_comparison_title=formats.HF_COMPARISON_TITLE,
        hf_comparison_note=formats.HF_COMPARISON_NOTE,
        ladder_rows=ladder_rows(groups),
        ladder_columns=formats.LADDER_COLUMNS,
        ladder_title=formats.LADDER_TITLE,
        ladder_note=formats.LADDER_NOTE,
        fine_note=formats.FINE_TUNING_NOTE,
        columns_of=formats.run_columns,
        evaluations_only=formats.evaluations_only,
        run_count=sum(g.run_count for g in groups),
        version=__version__,
        checked=checked,
        comparison=comparison,
        plots=plots.all_plots(groups),
        group_columns=[c for c in formats.GROUP_COLUMNS if c.page],
        warnings=formats.all_warnings,
        metric=format_metric,
        ratio=format_ratio,
    )
