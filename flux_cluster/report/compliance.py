"""The official ``mlperf_logging.compliance_checker`` on every result log, in worker processes.

The checker reads a whole log into memory; running it in workers keeps the harvester's own memory
bounded and uses every core. It is the same call ``result_summarizer`` makes.
"""

import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path


def check_log(path: Path, ruleset: str) -> tuple[bool, list[str]]:
    """(passed, the checker's messages) for one log, closed/open division taken from the log."""
    from mlperf_logging.compliance_checker import mlp_compliance

    logging.disable(logging.WARNING)  # the checker logs every message as a warning; we return them
    checker = mlp_compliance.make_checker(usage="training", ruleset=ruleset, quiet=True, werror=False)
    try:
        passed = bool(checker.check_file(str(path), f"training_{ruleset}/common.yaml"))
    except Exception as exc:  # the checker raises on logs it cannot follow; that is a failure too
        return False, [f"checker error: {type(exc).__name__}: {exc}"]
    messages = [*checker.overwritable.values(), *checker.not_overwritable]
    return passed, [" ".join(str(m).split()) for m in messages]


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
