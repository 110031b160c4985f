"""Preflight on one rank: an all_reduce there exchanges nothing, so no bandwidth is printed for it."""

import pytest

from flux_cluster.jobs.preflight import ONE_RANK_BANDWIDTH, print_summary


def report(world_size: int) -> dict:
    accelerators = {"count": 1, "names": ["NVIDIA H100 80GB HBM3"]}
    return {"rank": 0, "world_size": world_size, "host": "gpu1", "python": "3.12", "torch": "2.11"} | {
        "backend": "nccl",
        "accelerators": accelerators,
        "data_root": None,
        "run_dir": None,
    }


def test_one_rank_says_there_is_nothing_to_measure(capsys: pytest.CaptureFixture[str]) -> None:
    print_summary([report(1)], [], [])
    out = capsys.readouterr().out
    assert ONE_RANK_BANDWIDTH in out and "GB/s" not in out and "preflight: PASSED" in out


def test_several_ranks_print_their_bandwidth(capsys: pytest.CaptureFixture[str]) -> None:
    row = {"bytes": 2**20, "seconds": 1e-3, "busbw_gbps": 1.5}
    print_summary([report(2), report(2) | {"rank": 1}], [row], [])
    out = capsys.readouterr().out
    assert "all_reduce bus bandwidth 1.500 GB/s (best of 1 sizes)" in out and ONE_RANK_BANDWIDTH not in out
