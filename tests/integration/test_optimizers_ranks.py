"""Every train.optimizer on FSDP2 shards over 2 gloo ranks, resumed bit for bit from a checkpoint."""

import json
import os
import subprocess
import sys
from pathlib import Path

# One 2-rank run for all three optimizers: a toy of uneven shapes, so shards differ in size, one is
# empty, and the 4550-element weight (8-bit state in bitsandbytes) has shards under its 4096 minimum.
RANKS = """
import json, sys, torch, torch.distributed as dist
from pathlib import Path
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from flux_cluster.runtime.dist import exit_rank
from flux_cluster.training.checkpoint import Checkpointer
from flux_cluster.training.optimizers import PRODIGY, build_optimizer

dist.init_process_group("gloo")
rank = dist.get_rank()
folder = Path(sys.argv[1])
CPU = torch.device("cpu")
LR = {"adamw": 1e-2, "adamw8bit": 1e-2, "prodigy": 1.0}


def toy(mesh):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(33, 70), torch.nn.Linear(70, 65), torch.nn.Linear(65, 1))
    with torch.no_grad():
        model[2].weight.zero_()  # prodigy keeps no copy of an all-zero shard
    plain = [p.detach().clone() for p in model.parameters()]
    for layer in model:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh), plain


def backward(model, step):
    x = torch.randn(4, 33, generator=torch.Generator().manual_seed(100 * step + rank))
    model(x).square().mean().backward()


def local(model):
    return [p.to_local().clone() for p in model.parameters()]


report = {}
fsdp, hsdp = init_device_mesh("cpu", (2,)), init_device_mesh("cpu", (2, 1), mesh_dim_names=("r", "s"))
for name in ("adamw", "adamw8bit", "prodigy"):
    # FSDP: steps 1-2, checkpoint, step 3; then a fresh model and optimizer resume and take step 3.
    checkpoints = Checkpointer(folder / name, keep=1, rank=rank, world_size=2)
    model, plain = toy(fsdp)
    optimizer = build_optimizer(name, list(model.parameters()), LR[name], CPU)
    reference = torch.nn.Sequential(torch.nn.Linear(33, 70), torch.nn.Linear(70, 65), torch.nn.Linear(65, 1))
    if name == "prodigy":  # the same steps, unsharded, by prodigy itself: the d every rank must agree on
        from prodigyopt import Prodigy
        for p, value in zip(reference.parameters(), plain):
            p.data.copy_(value)
        single = Prodigy(reference.parameters(), lr=1.0, **PRODIGY)
    for step in (1, 2, 3):
        if step == 3:
            path = checkpoints.save(2, model, optimizer, {}, {})
        backward(model, step)
        if name == "prodigy":
            for p, q in zip(reference.parameters(), model.parameters()):
                p.grad = q.grad.full_tensor()
            single.step()
        optimizer.step()
        optimizer.zero_grad()
    uninterrupted = local(model)
    resumed, _ = toy(fsdp)
    optimizer2 = build_optimizer(name, list(resumed.parameters()), LR[name], CPU)
    checkpoints.load(path, resumed, optimizer2)
    backward(resumed, 3)
    optimizer2.step()
    result = {"resumed_equal": all(torch.equal(a, b) for a, b in zip(uninterrupted, local(resumed)))}
    tensors = [v for state in optimizer2.state.values() for v in state.values() if torch.is_tensor(v)]
    result["state_dtypes"] = sorted({str(v.dtype) for v in tensors})
    if name == "prodigy":
        result["d"] = [float(optimizer.param_groups[0][k]) for k in ("d", "d_numerator", "d_denom")]
        result["d_single"] = [float(single.param_groups[0][k]) for k in ("d", "d_numerator", "d_denom")]
        pairs = zip(model.parameters(), reference.parameters())
        result["near_single"] = all(torch.allclose(p.full_tensor(), q, rtol=1e-4, atol=0) for p, q in pairs)
    # HSDP (2 replicas of 1 shard): each rank sees different data; the replicas must stay identical.
    model, _ = toy(hsdp)
    optimizer = build_optimizer(name, list(model.parameters()), LR[name], CPU)
    for step in (1, 2):
        backward(model, step)
        optimizer.step()
        optimizer.zero_grad()
    result["replica"] = [p.to_local().tolist() for p in model.parameters()]
    report[name] = result
(folder / f"rank{rank}.json").write_text(json.dumps(report))
dist.destroy_process_group()
exit_rank(0)  # as the jobs end: FSDP's process groups outlive destroy_process_group (runtime/dist.py)
"""


def test_every_optimizer_steps_fsdp2_shards_and_resumes_bit_for_bit(tmp_path: Path) -> None:
    port = 29500 + (os.getpid() + 337) % 1000
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    env["OMP_NUM_THREADS"] = "1"
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANKS, str(tmp_path)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [rank.communicate(timeout=300) for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), [err[-3000:] for _, err in outputs]
    r0, r1 = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1))
    for name in ("adamw", "adamw8bit", "prodigy"):
        assert r0[name]["resumed_equal"] and r1[name]["resumed_equal"], name
        assert r0[name]["replica"] == r1[name]["replica"], name
    assert (
        "torch.uint8" in r0["adamw8bit"]["state_dtypes"] and "torch.uint8" in r1["adamw8bit"]["state_dtypes"]
    )
    # One d estimate on every rank, from sums over all shards: those of prodigy on the unsharded model.
    assert r0["prodigy"]["d"] == r1["prodigy"]["d"] and r0["prodigy"]["near_single"]
    for sharded, single in zip(r0["prodigy"]["d"], r0["prodigy"]["d_single"], strict=True):
        assert abs(sharded - single) <= 1e-4 * abs(single) and single != 0
