"""The official ``mlperf_logging.compliance_checker`` on every result log, in worker processes.

The checker reads a whole log into memory; running it in workers keeps the harvester's own memory
bounded and uses every core. It makes the checks ``result_summarizer`` makes.

The checker ``exec``s the code in its rules files, and picks the next file by formatting log values
into a path (``training_X/{submission_division}_common.yaml``, then ``{division}_{benchmark}.yaml``),
so a crafted log could make it load and run a file of its choosing. Two walls keep it to the rules the
installed package ships: the log values that reach a path must be on an allowlist before the checker
sees the log, and the checker can only queue rules files that exist in the package's folder for the
ruleset we chose (never one the log chose).
"""

import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from flux_cluster.mlperf_rules import RULESETS

DIVISIONS = ("closed", "open")


def _rules_dir(ruleset: str) -> Path:
    from mlperf_logging.compliance_checker import mlp_compliance

    return Path(mlp_compliance.__file__).parent / f"training_{ruleset}"


def _benchmarks(ruleset: str, division: str) -> list[str]:
    """Benchmarks the package has '{division}_{benchmark}.yaml' rules for."""
    names = os.listdir(_rules_dir(ruleset))
    prefix = f"{division}_"
    return sorted(
        n.removeprefix(prefix).removesuffix(".yaml")
        for n in names
        if n.startswith(prefix) and n.endswith(".yaml") and n != f"{division}_common.yaml"
    )


def refused_values(loglines: list[Any], ruleset: str) -> list[str]:
    """One message per log value that the rules would format into a file path and that is not one of
    the package's own names: submission_division, then submission_benchmark."""
    values: dict[str, list[Any]] = {"submission_division": [], "submission_benchmark": []}
    for line in loglines:
        if isinstance(line.key, str) and line.key in values and isinstance(line.value, dict):
            values[line.key].append(line.value.get("value"))
    refused = [
        f"submission_division: got {v!r}, expected one of {', '.join(DIVISIONS)}"
        for v in values["submission_division"]
        if v not in DIVISIONS
    ]
    divisions = [v for v in values["submission_division"] if v in DIVISIONS] or list(DIVISIONS)
    for division in dict.fromkeys(divisions):
        known = _benchmarks(ruleset, division)
        refused += [
            f"submission_benchmark: got {v!r}, expected one of {', '.join(known)} ({division}, {ruleset})"
            for v in values["submission_benchmark"]
            if v not in known
        ]
    return refused


def check_log(path: Path, ruleset: str) -> tuple[bool, list[str]]:
    """(passed, the checker's messages) for one log, closed/open division taken from the log."""
    if ruleset not in RULESETS:  # the rules folder is named by the ruleset: ours, never the log's
        return False, [f"ruleset {ruleset!r} is not one of {', '.join(RULESETS)}"]
    from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser

    quieted = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the checker logs every message as a warning; we return them
    checker = mlp_compliance.make_checker(usage="training", ruleset=ruleset, quiet=True, werror=False)
    allowed = {f"training_{ruleset}/{name}" for name in os.listdir(_rules_dir(ruleset))}
    refused: list[str] = []

    def enqueue_known(config: str) -> None:
        if config in allowed:
            mlp_compliance.enqueued_configs.append(config)
        else:
            refused.append(f"refused rules file {config!r}: not one of the package's training_{ruleset}/")

    # check_file's steps, with the values checked between parsing and the checks that use them
    original = mlp_compliance.enqueue_config
    mlp_compliance.enqueue_config = enqueue_known  # the rules call it by this global name
    mlp_compliance.enqueued_configs.clear()  # a failed check in this worker may have left some
    try:
        loglines, errors = mlp_parser.parse_file(str(path), ruleset=ruleset)
        refused += refused_values(loglines, ruleset)
        if refused:
            return False, refused
        if errors:
            checker.put_message("Log lines had parsing errors.")
        checker.check_loglines(loglines, f"training_{ruleset}/common.yaml")
    except Exception as exc:  # the checker raises on logs it cannot follow; that is a failure too
        return False, [*refused, f"checker error: {type(exc).__name__}: {exc}"]
    finally:
        mlp_compliance.enqueue_config = original
        mlp_compliance.enqueued_configs.clear()
        logging.disable(quieted)  # a caller in this process (a test) keeps its own warnings
    messages = [*refused, *checker.overwritable.values(), *checker.not_overwritable]
    return not messages, [" ".join(str(m).split()) for m in messages]


def check_logs(
    jobs: list[tuple[Path, str]], on_done: Callable[[], None] | None = None
) -> Iterator[tuple[int, bool, list[str]]]:
    """(index into jobs, passed, messages), as they finish."""
    if not jobs:
        return
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    context = multiprocessing.get_context("spawn")  # no fork of a process running rich's refresh thread
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(check_log, path, ruleset): i for i, (path, ruleset) in enumerate(jobs)}
        for future in as_completed(futures):
            if on_done is not None:
                on_done()
            try:
                passed, messages = future.result()
            except Exception as exc:  # a worker killed (out of memory on a huge log, say)
                passed, messages = False, [f"checker did not finish: {type(exc).__name__}: {exc}"]
            yield futures[future], passed, messages
