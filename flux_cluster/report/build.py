"""The whole harvest: groups found, logs streamed, compliance checked, groups scored."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from flux_cluster.mlperf_rules import QUALITY_TARGET
from flux_cluster.report.compliance import check_logs
from flux_cluster.report.discover import DEFAULT_RULESET, GroupSource, find_groups
from flux_cluster.report.evaluation import EvalResult, read_evals
from flux_cluster.report.finetune import read_fine_tuning
from flux_cluster.report.harvest import RunResult, harvest_run
from flux_cluster.report.scoring import FINE_TUNING_MODES, GroupResult, score_group


@dataclass(frozen=True)
class Options:
    check: bool = True
    """Run the official compliance checker on every log (the summarizer always does)."""
    ruleset: str | None = None
    """Compliance ruleset for every log; None: the run config's, a 'vX.Y' in the path, else 5.1.0."""
    price: float | None = None
    """USD per accelerator-hour for every group; None: the run config's price_per_gpu_hour."""
    prices: dict[str, float] = field(default_factory=dict)
    """USD per accelerator-hour by system name (--price SYSTEM=USD): wins over price and the config's."""
    peak_tflops: float | None = None
    """bf16 peak per accelerator for MFU; None: the run config's peak_bf16_tflops."""
    target: float = QUALITY_TARGET
    """Quality target for logs that do not log target_accuracy (a log's own wins)."""


NOT_APPLICABLE = "not applicable"
"""A fine-tuning run's compliance: it is no MLPerf result, so it is never given to the checker."""
MAX_CHECKED_LINE = 64 << 10
"""Longest line handed to the compliance checker (MLLOG lines are a few hundred bytes)."""


class Tracker(Protocol):
    """Progress: told the amount of work once, then each unit done."""

    def start(self, total: int) -> None: ...
    def advance(self, description: str) -> None: ...


class _Silent:
    def start(self, total: int) -> None:
        pass

    def advance(self, description: str) -> None:
        pass


def build(paths: list[Path], options: Options, tracker: Tracker | None = None) -> list[GroupResult]:
    """Every group under paths, scored."""
    tracker = tracker or _Silent()
    sources = find_groups(paths)
    tracker.start(sum(len(s.files) for s in sources) * (2 if options.check else 1))
    runs: list[list[RunResult]] = []
    jobs: list[tuple[Path, str]] = []
    slots: list[RunResult] = []
    for source in sources:
        source.ruleset = options.ruleset or source.ruleset or DEFAULT_RULESET
        runs.append([])
        for log in source.files:
            try:
                run = harvest_run(log, options.target, name=str(log))
            except OSError as exc:
                run = RunResult(file=str(log), warnings=[f"unreadable: {exc.strerror or exc}"])
            runs[-1].append(run)
            tracker.advance(f"reading {log.name}")
            if source.train_mode in FINE_TUNING_MODES:  # no MLPerf result: the rules do not apply
                run.fine_tuning = read_fine_tuning(log, run)
                run.compliance = NOT_APPLICABLE
                run.compliance_messages = [f"fine-tuning (train.mode {source.train_mode}): not checked"]
            if not options.check:
                continue
            if run.compliance == NOT_APPLICABLE:
                tracker.advance("checking compliance")
            elif any(w == "empty file" or w.startswith("unreadable:") for w in run.warnings):
                run.compliance, run.compliance_messages = "failed", list(run.warnings)
                tracker.advance("checking compliance")
            elif run.longest_line > MAX_CHECKED_LINE:
                # the official parser's re.sub(".*:::MLLOG ") is quadratic in the line length
                message = f"a {run.longest_line:,}-byte line (a crash's NUL fill?): not given to the checker"
                run.compliance, run.compliance_messages = "failed", [message]
                tracker.advance("checking compliance")
            else:
                jobs.append((log, source.ruleset))
                slots.append(run)
    for index, passed, messages in check_logs(jobs, lambda: tracker.advance("checking compliance")):
        slots[index].compliance = "passed" if passed else "failed"
        slots[index].compliance_messages = messages
    return [
        score_group(
            source,
            group_runs,
            options.check,
            options.prices.get(source.system or "", options.price),
            options.peak_tflops,
            _evals(source),
        )
        for source, group_runs in zip(sources, runs, strict=True)
    ]


def _evals(source: GroupSource) -> list[EvalResult]:
    """A run directory's flux-cluster evaluate results; their problems become the group's warnings."""
    return read_evals(source.path, source.warnings) if source.run_dir else []
