"""The repeat lock both training jobs (FLUX and hf) take on rank 0 and share with every rank."""

from pathlib import Path

import pytest

from flux_cluster.errors import FluxClusterError
from flux_cluster.rundir import lock_repeat
from flux_cluster.runtime.dist import DistInfo, lock_repeat_on_rank0, refusal


def test_a_second_attempt_of_a_repeat_is_one_line_on_every_rank(one_rank: DistInfo, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    held = lock_repeat_on_rank0(run_dir, 0, one_rank.rank)
    assert held is not None
    with pytest.raises(FluxClusterError) as refused:
        lock_repeat_on_rank0(run_dir, 0, one_rank.rank)
    assert "another attempt of repeat 0 is still running" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert lock_repeat_on_rank0(run_dir, 1, one_rank.rank) is not None  # another repeat is free
    held.close()
    assert lock_repeat(run_dir, 0) is not None  # released with its file


def test_a_refusal_every_rank_meets_is_said_by_rank_0_alone() -> None:
    line = "error: the lock is held"
    assert refusal(0, line).code == line  # printed by Python on exit, exit status 1
    assert refusal(3, line).code == 1  # the other ranks: exit 1, nothing printed
