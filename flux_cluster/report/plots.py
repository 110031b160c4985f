"""The report's plots as inline SVG (matplotlib, no pyplot state): readable offline, no scripts.

Every plot says on itself which groups it leaves out and why, so a missing bar is never mistaken for a
small one. Evaluation curves of very different lengths (a 9M-sample MLPerf run, a 6k-sample local one)
go to separate panels, each with its own sample axis.
"""

import functools
import io
import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flux_cluster.report.formats import evaluations_only
from flux_cluster.report.scoring import MAX_DROPPED, GroupResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_STYLE = {"svg.fonttype": "none", "font.family": "sans-serif", "font.size": 9, "axes.grid": True}
SCALE_RATIO = 10
"""Curves whose lengths (samples) differ by more than this share no panel: the shorter would be a dot."""
_NOTE_COLOR = "#8a5300"  # the page's warning colour
MAX_LEFT_OUT_LINES = 8
"""Groups or points a plot names as not shown, one line each; the rest are counted."""


@dataclass(frozen=True)
class Plot:
    title: str
    svg: str
    wide: bool = False
    """Spans the page's width (several panels)."""


def names(groups: list[GroupResult], sep: str = " ") -> list[str]:
    """One label per group: 'system (accelerators)' and the fine-tuning mode; where groups still read
    the same, the part of their paths that differs ('runs/pre/...' vs 'runs/lora/...': 'pre', 'lora')."""
    labels = []
    for group in groups:
        mode = f", {group.train_mode}" if group.fine_tuning else ""
        what = "inference" if evaluations_only(group) else f"{group.accelerators or '?'}{mode}"
        labels.append(f"{group.system or Path(group.path).name} ({what})")
    for label in set(labels):
        same = [i for i, other in enumerate(labels) if other == label]
        if len(same) < 2:
            continue
        parts = [Path(groups[i].path).parts for i in same]
        head, tail = _shared(parts), _shared([p[::-1] for p in parts])
        for i, path in zip(same, parts, strict=True):
            middle = path[head : max(head, len(path) - tail)]
            labels[i] = f"{label}{sep}{'/'.join(middle) or Path(groups[i].path).name}"
    return labels


def _shared(sequences: list[tuple[str, ...]]) -> int:
    """How many leading items all the sequences share."""
    count = 0
    for column in zip(*sequences, strict=False):
        if len(set(column)) > 1:
            break
        count += 1
    return count


def _plain(text: str) -> str:
    return text.replace("$", r"\$")  # matplotlib reads $...$ as mathematics


def _styled(draw: Callable[[list[GroupResult]], "Figure"]) -> Callable[[list[GroupResult]], str]:
    """A plot function drawn in the report's style and returned as inline SVG."""

    @functools.wraps(draw)
    def as_svg(groups: list[GroupResult]) -> str:
        import matplotlib

        with matplotlib.rc_context(_STYLE):
            return _svg(draw(groups))

    return as_svg


def _svg(figure: "Figure") -> str:
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG

    buffer = io.StringIO()
    title = figure.get_suptitle() or figure.axes[0].get_title()
    matplotlib.rcParams["svg.hashsalt"] = title  # unique ids per inline SVG
    with warnings.catch_warnings():  # a layout matplotlib cannot fit is drawn anyway; no user sees it
        warnings.simplefilter("ignore")
        FigureCanvasSVG(figure).print_svg(buffer, metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog: the SVG goes inline in HTML


@contextmanager
def report_figure(title: str) -> Iterator[tuple["Figure", "Axes"]]:
    """A figure and its axes drawn in the report's style (for plots outside this module: sweeps)."""
    import matplotlib

    with matplotlib.rc_context(_STYLE):
        yield _figure(title)


def figure_svg(figure: "Figure") -> str:
    """A figure as inline SVG, as every plot of the report."""
    return _svg(figure)


def _figure(title: str, width: float = 7.5, height: float = 4.0) -> tuple["Figure", "Axes"]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(title)
    return figure, axes


def _no_data(axes: "Axes", what: str, why: str | None = None) -> None:
    """The empty plot's one line: why (the real reason, where known), else that the logs have none."""
    axes.text(
        0.5, 0.5, why or f"no {what} in these logs", ha="center", va="center", transform=axes.transAxes,
        wrap=True,
    )  # fmt: skip


def _left_out(axes: "Axes", left_out: list[str], label: str = "") -> None:
    """Name the groups a plot does not show, under its x axis (where the layout keeps room for it)."""
    lines = [label] if label else []
    lines += [f"not shown: {_plain(item)}" for item in left_out[:MAX_LEFT_OUT_LINES]]
    if len(left_out) > MAX_LEFT_OUT_LINES:  # more would squeeze the plot to nothing
        lines.append(f"not shown: {len(left_out) - MAX_LEFT_OUT_LINES} more (see the tables)")
    if not lines:
        return
    axes.set_xlabel("\n".join(lines), loc="left" if left_out else "center")
    if left_out:
        axes.xaxis.label.set_color(_NOTE_COLOR)


def _why_no_score(group: GroupResult) -> str:
    if group.fine_tuning:
        return "fine-tuning, no olympic score"
    why = "too many failed" if group.run_count - group.scored_runs > MAX_DROPPED else "too few"
    return f"no olympic score ({group.scored_runs}/{group.run_count} runs scored: {why})"


def _panels(groups: list[GroupResult]) -> list[list[int]]:
    """Indices of the groups with evaluations, in panels of similar curve length (samples)."""
    lengths = {
        i: max(s for run in g.runs for s, _ in run.eval_curve)
        for i, g in enumerate(groups)
        if any(run.eval_curve for run in g.runs)
    }
    panels: list[list[int]] = []
    smallest = 0
    for i in sorted(lengths, key=lambda i: lengths[i]):
        if not panels or lengths[i] > SCALE_RATIO * max(smallest, 1):
            panels.append([])
            smallest = lengths[i]
        panels[-1].append(i)
    return panels


def eval_loss(groups: list[GroupResult]) -> Plot:
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    title = "Validation loss vs samples, every run"
    panels = _panels(groups)
    labels = names(groups)
    columns = min(len(panels), 2) or 1
    rows = max(1, math.ceil(len(panels) / columns))
    with matplotlib.rc_context(_STYLE):
        figure = Figure(figsize=(7.5 * columns, 4.5 * rows), layout="constrained")
        if not panels:
            axes = figure.add_subplot()
            axes.set_title(title)
            _no_data(axes, "evaluations")
            return Plot(title, _svg(figure))
        if len(panels) > 1:
            figure.suptitle(f"{title} (one panel per scale: each has its own sample axis)")
        colors = matplotlib.colormaps["tab10"]
        for number, panel in enumerate(panels, start=1):
            axes = figure.add_subplot(rows, columns, number)
            targets = set()
            for i in panel:
                for j, run in enumerate(r for r in groups[i].runs if r.eval_curve):
                    samples, losses = zip(*run.eval_curve, strict=True)
                    axes.plot(
                        samples, losses, color=colors(i % 10), alpha=0.75, linewidth=1,
                        marker="." if len(samples) < 40 else None,
                        label=_plain(labels[i]) if j == 0 else None,
                    )  # fmt: skip
                    targets.add(run.target)
            for target in sorted(targets):
                axes.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target}")
            axes.xaxis.set_major_formatter(EngFormatter(sep=""))
            axes.set_xlabel("samples")
            axes.set_ylabel("eval loss")
            axes.legend(fontsize=8)
            if len(panels) == 1:
                axes.set_title(title)
        without = [labels[i] for i, g in enumerate(groups) if not any(r.eval_curve for r in g.runs)]
        _left_out(axes, [f"{name}: no evaluations" for name in without], "samples")
        return Plot(title, _svg(figure), wide=len(panels) > 1)


def _bars(
    groups: list[GroupResult],
    title: str,
    ylabel: str,
    value: str,
    per_run: str,
    why: Callable[[GroupResult], str],
    bar_labels: Callable[[GroupResult], str],
) -> "Figure":
    """Bars of a group value (labelled with bar_labels, as a short bar is hard to read), dots for the
    scored runs, and the groups without the value named under the axis with why."""
    figure, axes = _figure(title)
    labels = dict(zip(map(id, groups), names(groups, "\n"), strict=True))
    shown = [g for g in groups if getattr(g, value) is not None]
    left_out = [g for g in groups if getattr(g, value) is None]
    _left_out(axes, [f"{labels[id(g)]}: {why(g)}".replace("\n", " ") for g in left_out])
    if not shown:
        reasons = sorted({why(g) for g in left_out})
        text = reasons[0] if len(reasons) == 1 else "none of these groups has one: see below for why"
        _no_data(axes, ylabel, f"nothing to draw: {_plain(text)}" if groups else None)
        return figure
    positions = range(len(shown))
    axes.bar(positions, [getattr(g, value) for g in shown], color="#4c72b0", alpha=0.8)
    for x, group in zip(positions, shown, strict=True):
        points = [getattr(r, per_run) for r in group.runs if r.scored and getattr(r, per_run) is not None]
        axes.scatter([x] * len(points), points, color="black", s=8, zorder=3)
        top = max([getattr(group, value), *points])  # over the dots too, where they reach higher
        axes.annotate(
            _plain(bar_labels(group)), (x, top), xytext=(0, 4), textcoords="offset points",
            ha="center", va="bottom", fontsize=8,
        )  # fmt: skip
    axes.set_xticks(list(positions), [_plain(labels[id(g)]) for g in shown], rotation=20, ha="right")
    axes.set_ylabel(ylabel)
    axes.margins(y=0.2)  # room for the label over the tallest bar
    return figure


def no_throughput(group: GroupResult) -> str:
    if group.throughput_note:  # the runs' summaries say why
        return group.throughput_note
    if group.throughput_samples_per_s is None:
        return "no throughput in its logs"
    return "accelerator count unknown"


@_styled
def throughput(groups: list[GroupResult]) -> "Figure":
    return _bars(
        groups, "Training throughput per accelerator (bars: mean; dots: scored runs)",
        "samples/s per accelerator", "throughput_per_accelerator", "throughput_per_accelerator",
        no_throughput, lambda g: f"{g.throughput_per_accelerator:,.2f}",
    )  # fmt: skip


def _time_and_cost(group: GroupResult) -> str:
    note = f"{group.olympic_minutes:,.1f} min"
    if group.scaling_factor != 1.0:
        note += f" (x{group.scaling_factor:g} RCP)"
    if group.gpu_hours is not None:
        note += f"\n{group.gpu_hours:,.1f} GPU-h"
    if group.cost_usd is not None:
        note += f", ${group.cost_usd:,.0f}"
    return note


@_styled
def time_to_train(groups: list[GroupResult]) -> "Figure":
    return _bars(
        groups, "Time to train (bars: olympic score; dots: scored runs) and cost per run",
        "minutes", "olympic_minutes", "minutes", _why_no_score, _time_and_cost,
    )  # fmt: skip


@_styled
def scaling(groups: list[GroupResult]) -> "Figure":
    figure, axes = _figure("Scaling: accelerators vs time to train")
    labels = names(groups)
    points: dict[tuple[int, float], list[str]] = {}  # groups with the same point share one label
    why_not: dict[str, str] = {}
    for group, label in zip(groups, labels, strict=True):
        if group.accelerators and group.olympic_minutes is not None:
            points.setdefault((group.accelerators, group.olympic_minutes), []).append(label)
        else:
            why_not[label] = _why_no_score(group) if group.accelerators else "accelerator count unknown"
    _left_out(axes, [f"{label}: {why}" for label, why in why_not.items()], "accelerators")
    if not points:
        reasons = sorted(set(why_not.values()))
        why = reasons[0] if len(reasons) == 1 else "see below for why"
        _no_data(axes, "scores", f"nothing to draw: {_plain(why)}" if groups else None)
        return figure
    xs = [x for x, _ in points]
    axes.scatter(xs, [y for _, y in points], color="#c44e52", zorder=3)
    for (x, y), texts in points.items():
        last = x == max(xs) and len(set(xs)) > 1  # the rightmost point's label goes to its left
        axes.annotate(
            _plain("\n".join(texts)), (x, y), textcoords="offset points", xytext=(-6 if last else 6, 0),
            ha="right" if last else "left", va="center", fontsize=8,
        )  # fmt: skip
    if len(set(xs)) < 2:
        axes.text(
            0.5, 0.92, "scaling needs scores at two or more accelerator counts; these logs have one",
            ha="center", va="top", transform=axes.transAxes, color=_NOTE_COLOR,
        )  # fmt: skip
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_ylabel("olympic minutes")
    return figure


FINE_TUNING_LOSS_TITLE = "Fine-tuning: validation loss vs samples (one line per group: the mean of its runs)"


@_styled
def fine_tuning_loss(groups: list[GroupResult]) -> "Figure":
    """The fine-tuning groups' validation-loss curves, side by side (runs of a group evaluate at the
    same samples, so a group's line is the mean at each, over the runs that reached it)."""
    from matplotlib.ticker import EngFormatter

    figure, axes = _figure(FINE_TUNING_LOSS_TITLE)
    labels = names(groups)
    without = []
    for group, label in zip(groups, labels, strict=True):
        if not group.fine_tuning:
            continue
        at: dict[int, list[float]] = {}
        for run in group.runs:
            for point in run.fine_tuning.curve if run.fine_tuning else []:
                at.setdefault(point.samples, []).append(point.loss)
        if not at:
            without.append(f"{label}: no evaluations")
            continue
        samples = sorted(at)
        axes.plot(
            samples, [sum(at[s]) / len(at[s]) for s in samples], linewidth=1.5,
            marker="." if len(samples) < 40 else None, label=_plain(label),
        )  # fmt: skip
    _left_out(axes, without, "samples (images)")
    if len(without) == sum(g.fine_tuning for g in groups):
        _no_data(axes, "fine-tuning evaluations")
        return figure
    axes.xaxis.set_major_formatter(EngFormatter(sep=""))
    axes.set_ylabel("validation loss")
    axes.legend(fontsize=8)
    return figure


SIDE_BY_SIDE_TITLE = "Environments side by side: training, inference, quality and cost"
_SIDE_PANELS: list[tuple[str, tuple[tuple[str, str], ...]]] = [
    ("training images/s", (("", "throughput_samples_per_s"),)),
    ("step time (ms)", (("", "step_time_ms"),)),
    ("time to train or run time (min)", (("", "mean_minutes"),)),
    ("inference s per image", (("p50", "inference_p50_s"), ("p99", "inference_p99_s"))),
    ("inference USD per 1,000 images", (("", "inference_usd_per_1k_images"),)),
    ("CLIP score", (("base", "clip_score_base"), ("tuned", "clip_score_tuned"))),
    ("GPU-hours per run", (("", "gpu_hours"),)),
    ("USD per run", (("", "cost_usd"),)),
]


def _side_value(group: GroupResult, attribute: str) -> float | None:
    if attribute == "mean_minutes" and group.olympic_minutes is not None:
        return group.olympic_minutes
    value: float | None = getattr(group, attribute)
    return value


def side_by_side(groups: list[GroupResult]) -> str:
    """One small bar panel per figure the side-by-side table compares, the same groups on each: a group
    without the figure gets 'n/a' in its place, and evaluations that mean nothing are named under them."""
    import matplotlib
    from matplotlib.figure import Figure

    labels = names(groups, "\n")
    with matplotlib.rc_context(_STYLE):
        figure = Figure(figsize=(15, 7.5), layout="constrained")
        figure.suptitle(SIDE_BY_SIDE_TITLE)
        colors = ("#4c72b0", "#dd8452")
        for number, (title, series) in enumerate(_SIDE_PANELS, start=1):
            axes = figure.add_subplot(2, 4, number)
            axes.set_title(title, fontsize=9)
            width = 0.8 / len(series)
            for k, (name, attribute) in enumerate(series):
                at = [x - 0.4 + width * (k + 0.5) for x in range(len(groups))]
                values = [_side_value(group, attribute) for group in groups]
                shown = [(x, v) for x, v in zip(at, values, strict=True) if v is not None]
                for x, value in zip(at, values, strict=True):
                    if value is None:
                        axes.text(x, 0, "n/a", ha="center", va="bottom", fontsize=7, color=_NOTE_COLOR)
                if shown:
                    axes.bar(*zip(*shown, strict=True), width, color=colors[k], label=name or None)
            if len(series) > 1 and axes.containers:
                axes.legend(fontsize=7)
            axes.set_xticks(
                range(len(groups)), [_plain(label) for label in labels], fontsize=7, rotation=20, ha="right"
            )
            axes.set_xlim(-0.6, len(groups) - 0.4)
            axes.margins(y=0.15)
        if not all(g.evals_meaningful is not False for g in groups):
            starred = ", ".join(
                _plain(n) for n, g in zip(names(groups), groups, strict=True) if g.evals_meaningful is False
            )
            figure.supxlabel(
                f"inference and CLIP figures NOT MEANINGFUL for: {starred}", color=_NOTE_COLOR, fontsize=8
            )
        return _svg(figure)


def all_plots(groups: list[GroupResult]) -> list[Plot]:
    """The training plots over the groups with runs (evaluations alone have no training to show), and
    the side-by-side panels over every fine-tuning or evaluated group."""
    trained = [g for g in groups if not evaluations_only(g)]
    shown = []
    if trained or not groups:
        shown = [
            eval_loss(trained),
            Plot("Throughput", throughput(trained)),
            Plot("Time to train and cost", time_to_train(trained)),
            Plot("Scaling", scaling(trained)),
        ]
    if any(g.fine_tuning for g in trained):
        shown.insert(1, Plot(FINE_TUNING_LOSS_TITLE, fine_tuning_loss(trained)))
    side = [g for g in groups if g.fine_tuning or g.evals]
    if side:
        shown.append(Plot(SIDE_BY_SIDE_TITLE, side_by_side(side), wide=True))
    return shown
