"""The report's plots as inline SVG (matplotlib, no pyplot state): readable offline, no scripts."""

import functools
import io
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from flux_cluster.report.scoring import GroupResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_STYLE = {"svg.fonttype": "none", "font.family": "sans-serif", "font.size": 9, "axes.grid": True}


def _label(group: GroupResult) -> str:
    return _plain(f"{group.system or Path(group.path).name} ({group.accelerators or '?'})")


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
    matplotlib.rcParams["svg.hashsalt"] = figure.axes[0].get_title()  # unique ids per inline SVG
    FigureCanvasSVG(figure).print_svg(buffer, metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog: the SVG goes inline in HTML


def _figure(title: str, width: float = 7.5, height: float = 4.0) -> tuple["Figure", "Axes"]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(title)
    return figure, axes


def _no_data(axes: "Axes", what: str) -> None:
    axes.text(0.5, 0.5, f"no {what} in these logs", ha="center", va="center", transform=axes.transAxes)


@_styled
def eval_loss(groups: list[GroupResult]) -> "Figure":
    import matplotlib

    figure, axes = _figure("Validation loss vs samples, every run", height=4.5)
    colors = matplotlib.colormaps["tab10"]
    targets = set()
    for i, group in enumerate(groups):
        for j, run in enumerate(group.runs):
            if not run.eval_curve:
                continue
            samples, losses = zip(*run.eval_curve, strict=True)
            axes.plot(
                samples, losses, color=colors(i % 10), alpha=0.75, linewidth=1,
                marker="." if len(samples) < 40 else None, label=_label(group) if j == 0 else None,
            )  # fmt: skip
            targets.add(run.target)
    for target in sorted(targets):
        axes.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target}")
    if targets:
        axes.set_xlabel("samples")
        axes.set_ylabel("eval loss")
        axes.legend(fontsize=8)
    else:
        _no_data(axes, "evaluations")
    return figure


def _bars(
    groups: list[GroupResult], title: str, ylabel: str, value: str, per_run: str
) -> tuple["Figure", "Axes"]:
    figure, axes = _figure(title)
    shown = [g for g in groups if getattr(g, value) is not None]
    if not shown:
        _no_data(axes, ylabel)
        return figure, axes
    positions = range(len(shown))
    axes.bar(positions, [getattr(g, value) for g in shown], color="#4c72b0", alpha=0.8)
    for x, group in zip(positions, shown, strict=True):
        points = [getattr(r, per_run) for r in group.runs if r.scored and getattr(r, per_run) is not None]
        axes.scatter([x] * len(points), points, color="black", s=8, zorder=3)
    axes.set_xticks(list(positions), [_label(g) for g in shown], rotation=20, ha="right")
    axes.set_ylabel(ylabel)
    return figure, axes


@_styled
def throughput(groups: list[GroupResult]) -> "Figure":
    figure, _ = _bars(
        groups, "Training throughput per accelerator (bars: mean; dots: scored runs)",
        "samples/s per accelerator", "throughput_per_accelerator", "throughput_per_accelerator",
    )  # fmt: skip
    return figure


@_styled
def time_to_train(groups: list[GroupResult]) -> "Figure":
    figure, axes = _bars(
        groups, "Time to train (bars: olympic score; dots: scored runs) and cost",
        "minutes", "olympic_minutes", "minutes",
    )  # fmt: skip
    shown = [g for g in groups if g.olympic_minutes is not None]
    for x, group in enumerate(shown):
        note = f"{group.gpu_hours:,.1f} GPU-h" if group.gpu_hours is not None else ""
        if group.cost_usd is not None:
            note += f"\n${group.cost_usd:,.0f}"
        axes.annotate(
            note,
            (x, (group.olympic_minutes or 0) / 2),
            ha="center",
            va="center",
            color="white",
            fontsize=9,
        )
    return figure


@_styled
def scaling(groups: list[GroupResult]) -> "Figure":
    figure, axes = _figure("Scaling: accelerators vs time to train")
    shown = [g for g in groups if g.accelerators and g.olympic_minutes is not None]
    if not shown:
        _no_data(axes, "groups with both an accelerator count and a score")
        return figure
    xs = [g.accelerators for g in shown]
    ys = [g.olympic_minutes for g in shown]
    axes.scatter(xs, ys, color="#c44e52", zorder=3)
    for group, x, y in zip(shown, xs, ys, strict=True):
        axes.annotate(
            _plain(group.system or Path(group.path).name),
            (x, y),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
        )
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("accelerators")
    axes.set_ylabel("olympic minutes")
    return figure


def all_plots(groups: list[GroupResult]) -> dict[str, str]:
    return {
        "Validation loss": eval_loss(groups),
        "Throughput": throughput(groups),
        "Time to train and cost": time_to_train(groups),
        "Scaling": scaling(groups),
    }
