"""The official ``mlperf_logging.compliance_checker`` on every result log, in worker processes.

It makes the checks ``result_summarizer`` makes, on what its parser would read, fed line by line: the
log is streamed (the harvester's reader: bounded lines, split as the parser's text mode splits them), only
``:::MLLOG`` lines reach the parser, each cut to what follows its last token as the parser cuts it (but
without its regex, which is quadratic in a line's length), and a line over MAX_LINE_BYTES is counted and
dropped, never held. Each log is checked in a process of its own with a deadline (``timeout``): a log that
takes longer is that run's verdict ("compliance check timed out after N s") and the others go on.

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
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flux_cluster.mlperf_rules import CHECK_TIMEOUT_S, MAX_LINE_BYTES, RULESETS, read_loglines

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

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
    from mlperf_logging.compliance_checker import mlp_compliance

    quieted = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the checker logs every message as a warning; we return them
    checker = mlp_compliance.make_checker(usage="training", ruleset=ruleset, quiet=True, werror=False)
    allowed = {f"training_{ruleset}/{name}" for name in os.listdir(_rules_dir(ruleset))}
    refused: list[str] = []
    dropped = 0

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
        loglines, errors, dropped = read_loglines(path, ruleset)
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
    shown = [" ".join(str(m).split()) for m in messages]
    if dropped:  # said beside the verdict; the checker judged the lines it could read
        shown.append(f"{dropped} :::MLLOG line(s) over {MAX_LINE_BYTES >> 10} KiB not given to the checker")
    return not messages, shown


def _check_in_process(path: Path, ruleset: str, send: "Connection") -> None:
    """A worker process: one log's verdict, sent back; never a traceback of its own on the terminal."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops us
    try:
        verdict = check_log(path, ruleset)
    except BaseException as exc:  # the package missing or broken, say
        verdict = False, [f"checker error: {type(exc).__name__}: {exc}"]
    try:
        send.send(verdict)
    finally:
        send.close()


def check_logs(
    jobs: list[tuple[Path, str]],
    on_done: Callable[[], None] | None = None,
    timeout: float = CHECK_TIMEOUT_S,
) -> Iterator[tuple[int, bool, list[str]]]:
    """(index into jobs, passed, messages), as they finish: each log in a process of its own, as many at
    once as there are cores, stopped past timeout seconds (that run's verdict says so)."""
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")  # no fork of a process running rich's refresh thread
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    waiting = list(enumerate(jobs))
    running: dict[int, tuple[Any, Any, float]] = {}  # index -> (process, its pipe's end, started)
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                index, (path, ruleset) = waiting.pop(0)
                receive, send = context.Pipe(duplex=False)
                process = context.Process(target=_check_in_process, args=(path, ruleset, send), daemon=True)
                process.start()
                send.close()
                running[index] = (process, receive, time.monotonic())
            soonest = min(started for _, _, started in running.values()) + timeout
            ready = wait([pipe for _, pipe, _ in running.values()], max(0.0, soonest - time.monotonic()))
            for index, (process, pipe, started) in list(running.items()):
                if pipe in ready:
                    try:
                        passed, messages = pipe.recv()
                    except (EOFError, OSError):  # it died (killed for memory, say)
                        process.join()
                        passed, messages = False, [f"checker did not finish (exit code {process.exitcode})"]
                elif time.monotonic() - started >= timeout:
                    passed, messages = False, [f"compliance check timed out after {timeout:g} s"]
                else:
                    continue
                _stop(process)
                pipe.close()
                del running[index]
                if on_done is not None:
                    on_done()
                yield index, passed, messages
    finally:
        for process, pipe, _ in running.values():  # the caller stopped early (an error, Ctrl-C)
            _stop(process)
            pipe.close()


def _stop(process: Any) -> None:
    process.join(1)  # one that sent its verdict is ending
    if process.is_alive():
        process.kill()
        process.join()
