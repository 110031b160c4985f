"""The index stage's record of the first shard its (forked) energon workers failed on."""

import multiprocessing
import os
from pathlib import Path

import pytest

from flux_cluster.data.prep.index import _ShardFailures
from flux_cluster.errors import FluxClusterError


def _die_holding(lock: object) -> None:
    lock.acquire()  # type: ignore[attr-defined]
    os._exit(0)  # as a worker the pool terminates mid-record: the lock is never released


def test_a_worker_killed_holding_the_lock_does_not_hang_the_stage(tmp_path: Path) -> None:
    failures = _ShardFailures(tmp_path)
    failures.first.get_obj().value = b"error: no space left on device while writing x: free space and rerun"
    lock = failures.first.get_lock()
    child = multiprocessing.get_context("fork").Process(target=_die_holding, args=(lock,))
    child.start()
    child.join(timeout=10)
    assert child.exitcode == 0
    with pytest.raises(FluxClusterError, match="no space left on device"):
        failures.raise_first()  # before the fix: blocked forever on the dead worker's lock


def test_no_failure_raises_nothing(tmp_path: Path) -> None:
    _ShardFailures(tmp_path).raise_first()
