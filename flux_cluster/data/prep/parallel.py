"""Run work items in worker processes and feed their progress reports to a StageProgress."""

import multiprocessing
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

from flux_cluster.data.prep.progress import StageProgress

Item = TypeVar("Item")
Report = Callable[[int, int], None]
"""report(samples, nbytes): called by a worker as it goes."""

_reports: Any = None


def _init_worker(reports: Any) -> None:
    global _reports
    _reports = reports


def _call(fn: Callable[[Any, Report], Any], item: Any) -> Any:
    return fn(item, lambda samples, nbytes: _reports.put((samples, nbytes)))


def run_parallel(
    fn: Callable[[Item, Report], Any], items: Iterable[Item], workers: int, progress: StageProgress
) -> list[Any]:
    """fn(item, report) for every item, in ``workers`` processes (in this one when workers is 1).

    Results come back in item order. The first failure cancels what has not started and is raised."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(item, progress.advance) for item in items]
    context = multiprocessing.get_context("spawn")  # no fork of a process that runs rich's refresh thread
    reports = context.Queue()
    # Drained by a thread until the pool has shut down: an exiting worker waits for its queue to be
    # flushed into the pipe, so a pipe nobody reads during shutdown would deadlock the join.
    stop = threading.Event()
    drainer = threading.Thread(target=_drain_until, args=(reports, progress, stop), daemon=True)
    drainer.start()
    try:
        with ProcessPoolExecutor(
            max_workers=min(workers, len(items)),
            mp_context=context,
            initializer=_init_worker,
            initargs=(reports,),
        ) as pool:
            futures: list[Future[Any]] = [pool.submit(_call, fn, item) for item in items]
            pending = set(futures)
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                    for future in done:
                        if future.exception() is not None:
                            raise future.exception()  # type: ignore[misc]
            except BaseException:
                for future in pending:
                    future.cancel()
                raise
    finally:
        stop.set()
        drainer.join()
    _drain(reports, progress)
    return [future.result() for future in futures]


def _drain_until(reports: Any, progress: StageProgress, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            samples, nbytes = reports.get(timeout=0.1)
        except queue.Empty:
            continue
        progress.advance(samples, nbytes)


def _drain(reports: Any, progress: StageProgress) -> None:
    while True:
        try:
            samples, nbytes = reports.get_nowait()
        except queue.Empty:
            return
        progress.advance(samples, nbytes)
