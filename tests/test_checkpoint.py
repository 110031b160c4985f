"""Checkpoints are committed atomically: a save killed half-way leaves the last good one readable."""

import signal
import subprocess
import sys
import time
from pathlib import Path

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
