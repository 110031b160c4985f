"""Reports: time-to-train, throughput and cost of result logs, run folders and sweeps."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flux_cluster.errors import FluxClusterError, NoResultsError

if TYPE_CHECKING:
    from flux_cluster.report.build import Tracker
    from flux_cluster.report.scoring import GroupResult
    from flux_cluster.report.sweep import SweepReport


@dataclass
class Report:
    """What flux-cluster report computes, as typed objects: scored groups of result logs and sweeps."""

    groups: "list[GroupResult]" = field(default_factory=list)
    sweeps: "list[SweepReport]" = field(default_factory=list)
    comparison: dict[str, Any] | None = None
    """report(compare=(A, B)): the B/A ratios of matched groups (groups holds A's, then B's)."""

    def to_json(self) -> dict[str, Any]:
        """The document 'flux-cluster report --format json' writes (a sweep's when the paths are sweeps)."""
        from flux_cluster.atomic import finite_for_json
        from flux_cluster.report.formats import to_document

        if self.sweeps:
            from flux_cluster.report.sweep import sweep_document

            return sweep_document(self.sweeps)
        return finite_for_json(to_document(self.groups, self.comparison))


def report(
    paths: Sequence[Path | str] = (),
    *,
    check: bool = True,
    ruleset: str | None = None,
    price: float | None = None,
    prices: Mapping[str, float] | None = None,
    peak_tflops: float | None = None,
    target: float | None = None,
    compare: tuple[Path | str, Path | str] | None = None,
    progress: "Tracker | None" = None,
    check_timeout: float | None = None,
) -> Report:
    """flux-cluster report PATHS: result logs scored as MLPerf does, fine-tuning and evaluation figures,
    or sweep folders' points (read only: a running sweep's files are its runner's to write).
    compare=(A, B): A's and B's groups with B/A ratios (give no paths). target: the quality target for
    logs that name none. progress: told the work to do, then each unit done. check_timeout: seconds one
    log's compliance check may take (None: the default). No result logs under a path: NoResultsError."""
    from flux_cluster.sweepdir import is_sweep_folder

    roots = [Path(p) for p in paths]
    if compare is not None:
        if roots:
            raise FluxClusterError("--compare A B takes its two paths itself: give no other paths")
    elif not roots:
        raise FluxClusterError("report: no paths given")
    elif any(is_sweep_folder(p) for p in roots):
        from flux_cluster.launch.sweep_status import sweep_reports

        return Report(sweeps=sweep_reports(roots))  # other paths among them: one error line
    from flux_cluster.mlperf_rules import QUALITY_TARGET
    from flux_cluster.report.build import Options, build

    options = Options(
        check=check,
        ruleset=ruleset,
        price=price,
        prices=dict(prices or {}),
        peak_tflops=peak_tflops,
        target=QUALITY_TARGET if target is None else target,
        **({} if check_timeout is None else {"check_timeout": check_timeout}),
    )

    def harvest(where: list[Path]) -> "list[GroupResult]":
        for root in where:
            if not root.exists():
                raise FluxClusterError(f"{root}: no such file or directory")
        groups = build(where, options, progress)
        if not groups:
            places = ", ".join(str(r) for r in where)
            raise NoResultsError(
                "no MLPerf result logs (files with :::MLLOG lines) and no flux-cluster evaluate results "
                f"under {places}"
            )
        return groups

    if compare is None:
        return Report(groups=harvest(roots))
    from flux_cluster.report.compare import compare as compare_groups

    a_root, b_root = Path(compare[0]), Path(compare[1])
    a, b = harvest([a_root]), harvest([b_root])
    return Report(groups=[*a, *b], comparison=compare_groups(a_root, a, b_root, b))
