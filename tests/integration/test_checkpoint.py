"""Checkpoints are committed atomically: a save killed half-way leaves the last good one readable, and a
damaged one is skipped for the newest intact one, with all ranks agreeing."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from flux_cluster.training.checkpoint import Checkpointer

SAVER = """
import sys, torch
from pathlib import Path
from flux_cluster.training.checkpoint import Checkpointer
model = torch.nn.Linear(4096, 4096)  # 64 MB of weights + 128 MB of AdamW state per save
optimizer = torch.optim.AdamW(model.parameters())
checkpoints = Checkpointer(Path(sys.argv[1]), keep=2, rank=0, world_size=1)
step = 0
while True:
    step += 1
    with torch.no_grad():
        model.weight.fill_(float(step))
    checkpoints.save(step, model, optimizer, {"samples": step * 16}, {"rank_value": step})
    print(step, flush=True)
"""


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4096, 4096)
    return model, torch.optim.AdamW(model.parameters())


def test_a_save_killed_midway_leaves_the_last_committed_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    saver = subprocess.Popen([sys.executable, "-c", SAVER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert saver.stdout is not None
    assert saver.stdout.readline().strip() == "1"
    deadline = time.monotonic() + 60
    while not list(folder.glob(".step_*.partial/*")) and time.monotonic() < deadline:
        time.sleep(0.002)
    saver.send_signal(signal.SIGKILL)  # while a later checkpoint is being written
    saver.wait()

    checkpoints = Checkpointer(folder, keep=2, rank=0, world_size=1)
    latest = checkpoints.latest()
    assert latest is not None and list(folder.glob(".step_*.partial")), "the kill must hit a save"
    model, optimizer = model_and_optimizer()
    shared, mine = checkpoints.load(latest, model, optimizer)
    step = shared["step"]
    assert latest.name == f"step_{step:08d}" and shared["samples"] == step * 16 and mine["rank_value"] == step
    assert torch.equal(model.weight, torch.full_like(model.weight, float(step)))
    assert len(checkpoints.committed()) <= 2  # older ones were pruned

    checkpoints.save(step + 1, model, optimizer, {"samples": 0}, {})
    assert not list(folder.glob(".step_*.partial")), "the next save removes the leftover"
    assert checkpoints.latest() == folder / f"step_{step + 1:08d}"


def test_a_different_world_size_is_refused(tmp_path: Path) -> None:
    model, optimizer = model_and_optimizer()
    path = Checkpointer(tmp_path, keep=1, rank=0, world_size=1).save(1, model, optimizer, {}, {})
    try:
        Checkpointer(tmp_path, keep=1, rank=0, world_size=2).load(path, model, optimizer)
    except RuntimeError as exc:
        assert "written by 1 ranks; this job has 2" in str(exc)
    else:
        raise AssertionError("a checkpoint of another world size must not load")


def small_model(fill: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(64, 64)
    with torch.no_grad():
        model.weight.fill_(fill)
    return model, torch.optim.AdamW(model.parameters())


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated shard": (lambda d: (d / "__0_0.distcp").write_bytes(b"x"), "__0_0.distcp has 1 bytes"),
    "truncated rank state": (lambda d: (d / "rank_00000.pt").write_bytes(b""), "rank_00000.pt has 0 bytes"),
    "empty train state": (lambda d: (d / "train_state.json").write_text(""), "train_state.json has 0 bytes"),
    "no .metadata": (lambda d: (d / ".metadata").unlink(), ".metadata is missing"),
    "same size, other bytes": (lambda d: flip_a_byte(d / "__0_0.distcp"), "__0_0.distcp does not match"),
    "no manifest": (lambda d: (d / "manifest.json").unlink(), "no manifest.json"),
    "garbled manifest": (lambda d: (d / "manifest.json").write_text("{"), "manifest.json is unreadable"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_newest_checkpoint_is_skipped_for_the_last_intact_one(tmp_path: Path, damage: str) -> None:
    checkpoints = Checkpointer(tmp_path, keep=3, rank=0, world_size=1)
    for step in (1, 2):
        model, optimizer = small_model(float(step))
        checkpoints.save(step, model, optimizer, {"samples": step * 16}, {"rank_value": step})
    damage_it, reason = DAMAGE[damage]
    damage_it(tmp_path / "step_00000002")

    chosen, skipped = checkpoints.choose()
    assert chosen == tmp_path / "step_00000001"
    (line,) = skipped
    assert "step_00000002 skipped (kept as .step_00000002.rejected)" in line and reason in line, line
    assert "\n" not in line
    assert (tmp_path / ".step_00000002.rejected").is_dir() and checkpoints.committed() == [chosen]
    model, optimizer = small_model(0.0)
    shared, mine = checkpoints.load(chosen, model, optimizer)
    assert shared["samples"] == 16 and mine["rank_value"] == 1 and torch.all(model.weight == 1.0)


def test_no_intact_checkpoint_means_a_fresh_start(tmp_path: Path) -> None:
    checkpoints = Checkpointer(tmp_path, keep=2, rank=0, world_size=1)
    checkpoints.save(1, *small_model(1.0), {}, {})
    (tmp_path / "step_00000001" / ".metadata").unlink()
    chosen, skipped = checkpoints.choose()
    assert chosen is None and len(skipped) == 1
    assert checkpoints.choose() == (None, [])  # set aside once, not reported again


# Two gloo ranks: rank 1 alone hashes __0_0.distcp (each rank checks a share of the sha256 sums), so only
# it sees the damage; both must still resume from the same, older checkpoint.
AGREEMENT = """
import json, os, sys, torch, torch.distributed as dist
from pathlib import Path
from torch.distributed.fsdp import fully_shard
from flux_cluster.runtime.dist import exit_rank
from flux_cluster.training.checkpoint import Checkpointer
folder = Path(sys.argv[1])
rendezvous = f"file://{folder.parent / 'rendezvous'}"  # no port to pick
dist.init_process_group("gloo", init_method=rendezvous, rank=int(os.environ["RANK"]), world_size=2)
rank = dist.get_rank()
checkpoints = Checkpointer(folder, keep=3, rank=rank, world_size=2)
model = fully_shard(torch.nn.Linear(64, 64))
optimizer = torch.optim.AdamW(model.parameters())
for step in (1, 2):
    checkpoints.save(step, model, optimizer, {}, {"rank": rank})
dist.barrier()
if rank == 0:
    data = bytearray((folder / "step_00000002" / "__0_0.distcp").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / "step_00000002" / "__0_0.distcp").write_bytes(bytes(data))
dist.barrier()
chosen, skipped = checkpoints.choose()
print(json.dumps({"rank": rank, "chosen": chosen.name, "skipped": skipped}), flush=True)
dist.barrier()
dist.destroy_process_group()
exit_rank(0)  # as the jobs end: FSDP's process groups outlive destroy_process_group (runtime/dist.py)
"""


def test_all_ranks_agree_on_the_checkpoint_when_only_one_sees_the_damage(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", AGREEMENT, str(tmp_path / "checkpoints")],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), [err[-2000:] for _, err in outputs]
    verdicts = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [v["chosen"] for v in verdicts] == ["step_00000001", "step_00000001"]
    assert all("__0_0.distcp does not match its sha256" in v["skipped"][0] for v in verdicts)


def test_a_full_disk_fails_the_save_in_one_line_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    import torch.distributed as dist
    from data_helpers import fill_disk, small_disk

    with small_disk(tmp_path / "disk") as disk:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
        try:
            checkpoints = Checkpointer(disk / "checkpoints", keep=2, rank=0, world_size=1)
            model = torch.nn.Linear(256, 256)  # 256 KB of weights, 512 KB of AdamW state once stepped
            optimizer = torch.optim.AdamW(model.parameters())
            model(torch.ones(1, 256)).sum().backward()
            optimizer.step()
            checkpoints.save(1, model, optimizer, {"samples": 16}, {"rank_value": 1})
            first = model.weight.detach().clone()
            fill_disk(disk, leave=256 << 10)
            with pytest.raises(SystemExit) as failed:
                checkpoints.save(2, model, optimizer, {"samples": 32}, {"rank_value": 2})
        finally:
            dist.destroy_process_group()
        line = str(failed.value.code)
        assert line == (
            f"error: no space left on device while writing {disk / 'checkpoints' / 'step_00000002'}: "
            "free space and rerun"
        ), line
        assert not list((disk / "checkpoints").glob(".step_*")), "the partial folder is removed"
        (disk / "filler").unlink()
        chosen, skipped = checkpoints.choose()
        assert chosen == disk / "checkpoints" / "step_00000001" and skipped == []
        model = torch.nn.Linear(256, 256)
        shared, mine = checkpoints.load(chosen, model, torch.optim.AdamW(model.parameters()))
        assert shared["samples"] == 16 and mine["rank_value"] == 1 and torch.equal(model.weight, first)
