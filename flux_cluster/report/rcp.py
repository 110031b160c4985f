"""Reference convergence points (RCP), as the installed ``mlperf_logging.rcp_checker`` has them and uses
them: its JSON file for the ruleset, its statistics (olympic mean of the reference runs, their standard
deviation, the slowest mean a submission may have: a one-sided t-test), its pruning and its lookup (the
batch's own point, else a linear interpolation between the neighbours, the smallest below every point,
"Missing RCP" above them). Nothing of it is copied: the checker's own objects are asked.

``verdict`` says what the checker says of a group of runs at one global batch (``check_directory`` with
the pruned points, as the summarizer runs it), from the samples the harvester read, without the checker
reading the logs again or writing ``scaling.json``.
"""

import logging
import math
import statistics
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from flux_cluster.errors import FluxClusterError

USAGE = "training"
MISSING = "Missing RCP, please submit RCP with BS = {b}"
"""check_directory's words where no RCP holds a submission at its batch."""
PASS = "pruned_rcps"
"""The summarizer's (and the package checker's) choice of points: the pruned ones."""


@dataclass(frozen=True)
class Reference:
    """The RCP the checker compares a submission at ``batch`` with."""

    ruleset: str
    benchmark: str
    batch: int
    mean: float
    """Olympic mean samples to converge of the reference runs (interpolated between batches)."""
    stdev: float
    """Standard deviation of one reference run's samples to converge (over all of them, ddof 0)."""
    min_mean: float
    """The lowest olympic mean a submission may have and pass (mean / the checker's max speedup)."""
    kind: str
    """'found' (the batch has its point), 'interpolated', or 'smallest' (below every point: the checker
    takes the smallest batch's)."""
    batches: tuple[int, ...]
    """The batch sizes of the pruned points, ascending."""
    hyperparameters: dict[str, Any]
    """The reference runs' optimizer settings at this batch ({} for an interpolated point)."""


def rcp_file(ruleset: str, benchmark: str) -> Path:
    from mlperf_logging.rcp_checker import rcp_checker

    return Path(rcp_checker.__file__).parent / f"{USAGE}_{ruleset}" / f"rcps_{benchmark}.json"


@cache
def _checker(ruleset: str, benchmark: str) -> Any:
    from mlperf_logging.rcp_checker import rcp_checker

    if not rcp_file(ruleset, benchmark).is_file():
        raise FluxClusterError(
            f"ruleset {ruleset}: the installed mlperf_logging has no RCP file for {benchmark} "
            f"({rcp_file(ruleset, benchmark)})"
        )
    quieted = logging.root.manager.disable
    logging.disable(logging.WARNING)  # its records go to the root logger
    try:
        return rcp_checker.RCP_Checker(USAGE, ruleset, benchmark, verbose=False)
    finally:
        logging.disable(quieted)


def has_rcps(ruleset: str | None, benchmark: str | None) -> bool:
    """Whether the checker has RCPs for them; only its own names reach a path (never a log's value)."""
    from mlperf_logging.rcp_checker import rcp_checker

    from flux_cluster.mlperf_rules import RULESETS

    known = ruleset in RULESETS and benchmark in rcp_checker.submission_runs[USAGE]
    return known and rcp_file(str(ruleset), str(benchmark)).is_file()


@cache
def reference(ruleset: str, batch: int, benchmark: str = "flux1") -> Reference:
    """The RCP for a global batch, looked up as check_directory does; above every point: one line."""
    checker = _checker(ruleset, benchmark)
    batches = tuple(sorted(r["BS"] for r in checker.pruned_rcp_data.values()))
    record, kind = checker._find_rcp(batch, PASS), "found"
    if record is None:
        low, high = checker._find_top_min_rcp(batch, PASS), checker._find_bottom_max_rcp(batch, PASS)
        if low is not None and high is not None:
            _, record = checker._create_interp_rcp(batch, low, high)
            kind = "interpolated"
        elif high is not None:
            record, kind = checker._find_min_rcp(PASS), "smallest"
        else:
            raise FluxClusterError(
                f"global batch {batch}: above every RCP of ruleset {ruleset} for {benchmark} (batches "
                f"{', '.join(map(str, batches))}): the RCP checker says 'Missing RCP'; pick a batch of at "
                f"most {batches[-1]}"
            )
    return Reference(
        ruleset=ruleset,
        benchmark=benchmark,
        batch=batch,
        mean=float(record["RCP Mean"]),
        stdev=float(record["RCP Stdev"]),
        min_mean=float(record["RCP Mean"] / record["Max Speedup"]),
        kind=kind,
        batches=batches,
        hyperparameters=dict(record.get("Hyperparams") or {}) if kind == "found" else {},
    )


@cache
def reference_spread(benchmark: str = "flux1") -> tuple[float, tuple[str, ...]]:
    """(relative standard deviation, the rulesets compared) of a reference set's mean samples to converge
    at one batch: how far apart the installed mlperf_logging's RCP files of different rulesets put the mean
    at the batches whose points the checker keeps in both (its pruned points; identical files counted
    once). flux1's 5.1.0 and 6.0.0 sets differ by 1.6-13.1% at 512, 2048 and 4096, each with the same
    learning rate and warmup: a shift between two runs of the same reference, the one evidence of how much a
    mean moves with the implementation beyond the RCP's run-to-run spread. Two sets differ by sqrt(2)
    standard deviations, so the spread is the root mean square of the log ratios over sqrt(2); (0.0, ())
    with fewer than two distinct files."""
    from flux_cluster.mlperf_rules import RULESETS

    means: dict[tuple[tuple[int, float], ...], str] = {}
    for ruleset in RULESETS:
        if has_rcps(ruleset, benchmark):
            points = _checker(ruleset, benchmark).pruned_rcp_data.values()
            means.setdefault(tuple(sorted((int(r["BS"]), float(r["RCP Mean"])) for r in points)), ruleset)
    sets = [dict(points) for points in means]
    logs = [
        math.log(a[batch] / b[batch])
        for i, a in enumerate(sets)
        for b in sets[i + 1 :]
        for batch in a.keys() & b.keys()
    ]
    if not logs:
        return 0.0, ()
    return math.sqrt(statistics.fmean(x * x for x in logs) / 2), tuple(means.values())


def submission_runs(benchmark: str) -> int:
    """Result files the checker expects of a submission (flux1: 10)."""
    from mlperf_logging.rcp_checker import rcp_checker

    return int(rcp_checker.submission_runs[USAGE].get(benchmark, 0))


def submission_mean(samples: list[float | None], max_dropped: int = 1) -> float | None:
    """The checker's (and the summarizer's) samples to converge of a submission: the olympic mean, one run
    dropped at each end, a run that did not converge counted as the slowest (rcp_checker's
    _eval_submission_record, get_submission_epochs); None: more than ``max_dropped`` did not converge, or
    fewer than 3 runs."""
    per_run = sorted(math.inf if s is None else float(s) for s in samples)
    if sum(math.isinf(s) for s in per_run) > max_dropped or len(per_run) < 3:
        return None
    return float(statistics.fmean(per_run[1:-1]))


def verdict(ruleset: str, benchmark: str, batch: int | None, samples: list[float | None]) -> dict[str, Any]:
    """What the RCP checker's check_directory says of these runs (samples to converge per run; None: did
    not converge): 'pass', 'pass, normalized' (faster than the RCP mean within its tolerance: the score is
    multiplied by ``factor``), 'fail' (faster than the checker accepts), 'missing RCP' (above every RCP, or
    below the smallest and faster than it: the checker asks for an RCP at this batch), 'insufficient
    convergence', 'no global batch', each with 'too few runs' where the group has fewer than the checker
    expects; ``message``: the checker's own words."""
    needed = submission_runs(benchmark)
    out: dict[str, Any] = {"ruleset": ruleset, "batch": batch, "runs": len(samples), "runs_needed": needed}
    out["too_few_runs"] = len(samples) < needed
    if batch is None:
        return out | {"verdict": "no global batch", "message": "Could not detect global_batch_size"}
    mean = submission_mean(samples)
    if mean is None:
        word = "insufficient convergence" if len(samples) >= 3 else "too few runs"
        return out | {"verdict": word, "message": "Insufficient convergence"}
    missing = MISSING.format(b=batch)
    try:
        ref = reference(ruleset, batch, benchmark)
    except FluxClusterError:
        return out | {"verdict": "missing RCP", "message": missing}
    factor = max(1.0, ref.mean / mean)
    passed = mean >= ref.min_mean
    if ref.kind == "smallest":
        word = "pass" if passed else "missing RCP"
        message = "RCP not found but slower convergence on smaller batch size" if passed else missing
    else:
        word = ("pass, normalized" if factor > 1.0 else "pass") if passed else "fail"
        message = "RCP found" if ref.kind == "found" else "RCP Interpolation"
    return out | {
        "verdict": word,
        "message": message,
        "factor": factor,
        "mean_samples": mean,
        "rcp": ref.kind,
        "rcp_mean": ref.mean,
        "rcp_stdev": ref.stdev,
        "rcp_min_mean": ref.min_mean,
    }


def verdict_text(rcp: dict[str, Any] | None) -> str | None:
    """One cell: 'pass', 'pass x1.021' (the normalization factor), 'fail', ... '(3 of 10 runs)'."""
    if not rcp:
        return None
    text = rcp["verdict"]
    if text == "pass, normalized":
        text = f"pass x{rcp['factor']:.3f}"
    if rcp.get("too_few_runs") and text != "too few runs":
        text += f" ({rcp['runs']} of {rcp['runs_needed']} runs)"
    return text
