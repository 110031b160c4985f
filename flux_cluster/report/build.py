"""The whole harvest: groups found, logs streamed, compliance checked, groups scored; evaluations outside
a run grouped by the system they were measured on."""

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from flux_cluster.config.hf import HF_BENCHMARK
from flux_cluster.errors import FluxClusterError
from flux_cluster.mlperf_rules import CHECK_TIMEOUT_S, QUALITY_TARGET, RULESETS
from flux_cluster.report.compliance import check_logs
from flux_cluster.report.discover import DEFAULT_RULESET, GroupSource, find_inputs
from flux_cluster.report.evaluation import EVALUATIONS_ONLY, EvalResult, read_eval, read_evals
from flux_cluster.report.finetune import read_fine_tuning
from flux_cluster.report.harvest import RunResult, harvest_run
from flux_cluster.report.hf import hf_figures, read_hf
from flux_cluster.report.scoring import FINE_TUNING_MODES, GroupResult, eval_figures, score_group


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
    check_timeout: float = CHECK_TIMEOUT_S
    """Seconds one log's compliance check may take; past it, that run fails with a line saying so."""


PARTIAL_610_RULESET = "6.0.0"
"""Logs with some of 6.1.0's disclosure keys but not all: 6.0 round implementations (AMD's) log several."""
NOT_APPLICABLE = "not applicable"
"""A fine-tuning run's compliance: it is no MLPerf result, so it is never given to the checker."""


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
    """Every group under paths, scored; then the evaluations outside a run, a group per system."""
    tracker = tracker or _Silent()
    sources, eval_paths = find_inputs(paths)
    tracker.start(sum(len(s.files) for s in sources) * (2 if options.check else 1) + len(eval_paths))
    runs: list[list[RunResult]] = []
    jobs: list[tuple[Path, str]] = []
    slots: list[RunResult] = []
    for source in sources:
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
                if source.workload == HF_BENCHMARK:
                    run.fine_tuning.hf = read_hf(log, run)
                    run.mfu = run.fine_tuning.hf.mfu  # measured against the precision's peak
                run.compliance = NOT_APPLICABLE
                run.compliance_messages = [f"fine-tuning (train.mode {source.train_mode}): not checked"]
        trained = {r.fine_tuning.world_size for r in runs[-1] if r.fine_tuning and r.fine_tuning.hf}
        if len(trained) == 1 and None not in trained:  # hf: the devices that trained (dp on a CPU: one)
            source.accelerators = trained.pop()
        choose_ruleset(source, runs[-1], options.ruleset)
        for log, run in zip(source.files, runs[-1], strict=True):
            if not options.check:
                continue
            if run.compliance == NOT_APPLICABLE:
                tracker.advance("checking compliance")
            elif any(w == "empty file" or w.startswith("unreadable:") for w in run.warnings):
                run.compliance, run.compliance_messages = "failed", list(run.warnings)
                tracker.advance("checking compliance")
            else:
                jobs.append((log, source.ruleset or DEFAULT_RULESET))
                slots.append(run)
    checked = check_logs(jobs, lambda: tracker.advance("checking compliance"), options.check_timeout)
    for index, passed, messages in checked:
        slots[index].compliance = "passed" if passed else "failed"
        slots[index].compliance_messages = messages
    groups = [
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
    for group in groups:
        hf_figures(group)
    read = {os.path.realpath(e.file) for g in groups for e in g.evals}  # a run's, also named on its own
    alone = [p for p in eval_paths if os.path.realpath(p) not in read]
    return groups + evaluation_groups(alone, options, tracker)


def choose_ruleset(source: GroupSource, runs: list[RunResult], given: str | None) -> None:
    """source.ruleset and where it came from: --ruleset, else the run config's, else what the logs show
    (all of 6.1.0's keys, 6.x's evaluation_frequency), else a 'vX.Y' in the path, else 6.0.0 where the logs
    carry some of 6.1.0's keys but not all (a 6.0 round's: the summarizer is run with the round's ruleset,
    and a 6.1.0 checker fails such a log), saying so, else DEFAULT_RULESET with a warning that asks for
    --ruleset (never silently)."""
    logged = {r.logged_ruleset for r in runs if r.logged_ruleset}
    partial = sorted({k for r in runs for k in r.missing_610_keys})
    if given:
        source.ruleset, source.ruleset_from = given, "--ruleset"
    elif source.ruleset:
        source.ruleset_from = "run config"
    elif len(logged) == 1:
        source.ruleset, source.ruleset_from = logged.pop(), "logs"
    elif source.path_ruleset:
        source.ruleset, source.ruleset_from = source.path_ruleset, "path"
    elif partial and not logged:
        source.ruleset, source.ruleset_from = PARTIAL_610_RULESET, "logs"
        source.warnings.append(
            f"ruleset: the logs carry some of 6.1.0's disclosure keys but not {', '.join(partial)} (which "
            f"6.1.0 requires): read as a 6.0 round's ({PARTIAL_610_RULESET}); give --ruleset if not"
        )
    else:
        source.ruleset, source.ruleset_from = DEFAULT_RULESET, "assumed"
        if source.train_mode not in FINE_TUNING_MODES and runs:
            source.warnings.append(
                f"ruleset: neither the logs nor the path (vX.Y) say which; {DEFAULT_RULESET} assumed; "
                f"give --ruleset {'|'.join(RULESETS)} if they are another round's"
            )
    if len(logged) > 1:
        source.warnings.append(f"the logs read as different rulesets ({', '.join(sorted(logged))})")


def _evals(source: GroupSource) -> list[EvalResult]:
    """A run directory's flux-cluster evaluate results; their problems become the group's warnings."""
    return read_evals(source.path, source.warnings) if source.run_dir else []


def evaluation_groups(
    paths: list[Path], options: Options, tracker: Tracker | None = None
) -> list[GroupResult]:
    """flux-cluster evaluate results outside a run (a LoRA file's, a pipeline's alone), one group per
    system they record (evaluate --system), so environments compare on inference alone; a result that
    records none goes with the others of its folder. Their problems become their group's warnings."""
    tracker = tracker or _Silent()
    by_key: dict[str, tuple[list[EvalResult], list[str], list[Path]]] = {}
    for path in paths:
        warnings: list[str] = []
        result = read_eval(path, warnings)
        tracker.advance(f"reading {path.name}")
        system = result.system if result else None
        key = f"system {system}" if system else f"folder {path.parent}"
        evals, group_warnings, files = by_key.setdefault(key, ([], [], []))
        evals += [result] if result else []
        group_warnings += warnings
        files.append(path)
    groups = []
    for evals, warnings, files in by_key.values():
        system = evals[0].system if evals else None
        devices = {e.device for e in evals if e.device}
        group = GroupResult(
            path=os.path.commonpath([str(f.parent) for f in files]),
            benchmark=EVALUATIONS_ONLY,
            system=system,
            submitter=None,
            accelerator_model=devices.pop() if len(devices) == 1 else None,
            accelerators=None,
            ruleset=None,
            runs=[],
            price_per_gpu_hour=_price(options, system),
            warnings=warnings,
        )
        if evals:
            eval_figures(group, evals)
        groups.append(group)
    return sorted(groups, key=lambda g: (g.system is None, g.system or "", g.path))


def _price(options: Options, system: str | None) -> float | None:
    """--price for the system an evaluation names, else that system's price_per_gpu_hour where it is a
    known system's plain name (a name from a results file never reaches the file system as a path)."""
    from flux_cluster.config import load_system
    from flux_cluster.config.loader import known_systems

    price = options.prices.get(system or "", options.price)
    if price is not None or not system or system not in known_systems():
        return price
    try:
        return load_system(system).config.price_per_gpu_hour
    except FluxClusterError:
        return None
