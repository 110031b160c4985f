"""The report as one self-contained HTML page: tables, warnings and inline SVG plots, no scripts."""

from typing import Any

from flux_cluster.report import formats, plots
from flux_cluster.report.scoring import GroupResult


def render_html(groups: list[GroupResult], checked: bool, comparison: dict[str, Any] | None = None) -> str:
    import jinja2

    from flux_cluster import __version__

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("flux_cluster.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    return environment.get_template("report.html.j2").render(
        groups=groups,
        run_count=sum(g.run_count for g in groups),
        version=__version__,
        checked=checked,
        comparison=comparison,
        plots=plots.all_plots(groups),
        group_columns=formats.GROUP_COLUMNS,
        run_columns=formats.RUN_COLUMNS,
        warnings=formats.all_warnings,
        number=formats.format_number,
        ratio=formats.format_ratio,
    )
