"""Issue 40, item 4: a one-rank throughput sweep over micro-batches on --system local forecasts the
two-rank run's samples/s, checked against a real two-rank run (gloo, the tiny model, synthetic data)."""

from pathlib import Path

from flux_cluster import api


def test_a_one_rank_sweep_forecasts_the_two_rank_run(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    sweep = api.sweep(
        "local",
        {"train.micro_batch_size": [4, 16]},
        overrides=["gpus_per_node=1"],
        synthetic=True,
        name="mbs",
        runs_dir=runs,
        warmup_steps=2,
        steps=8,
    )
    assert [row["status"] for row in sweep.rows()] == ["ok", "ok"]
    run = api.submit(
        "local",
        "throughput",
        ["train.micro_batch_size=8", "train.global_batch_size=16"],
        synthetic=True,
        runs_dir=runs,
        warmup_steps=2,
        steps=8,
    )
    record = run.throughput()
    assert record is not None and record["world_size"] == 2, record
    result = api.forecast([sweep.folder], system="local", gpus=[(2, 16)])
    (row,) = result.rows
    assert row.per_gpu_batch == 8 and not row.extrapolated  # between the measured 4 and 16
    assert "shard groups of 2" in row.basis  # the two ranks' collectives are counted
    measured = record["samples_per_s"]
    assert row.samples_per_s_low <= measured <= row.samples_per_s_high, (row, measured)
