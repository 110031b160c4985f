"""train.optimizer under FSDP2 and train.lora_init: every optimizer steps sharded (DTensor) parameters on
2 gloo ranks, keeps replicated values equal, and resumes bit for bit from a checkpoint; LoRA adapters
start from a saved file, and a file that does not fit the config is one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from flux_cluster.config.workload import load_workload
from flux_cluster.errors import FluxClusterError
from flux_cluster.training import model as M
from flux_cluster.training.optimizers import build_optimizer

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


# ---- train.lora_init, in this process on the tiny model

TINY = load_workload("flux1")[0].models["tiny"]
TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def adapted(seed: int, rank: int = 4, targets: list[str] = TARGETS) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = M.build_model(TINY)
    M.add_lora(model, rank, rank, targets)
    return model


def adapters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}


@pytest.fixture(scope="module")
def lora_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    trained = adapted(1)
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.normal_()  # as trained: lora_B starts at zero
    path = M.save_lora(M.lora_state_dict(trained), M.lora_metadata(trained), tmp_path_factory.mktemp("lora"))
    return path, adapters(trained)


def test_lora_init_starts_the_adapters_from_the_file(lora_file: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, expected = lora_file
    model = adapted(2)
    assert any(not torch.equal(v, expected[k]) for k, v in adapters(model).items())
    M.load_lora_init(model, path, 4, TARGETS)
    got = adapters(model)
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)


@pytest.mark.parametrize(
    ("rank", "targets", "line"),
    [
        (
            8,
            TARGETS,
            "rank 4 and targets ['to_k', 'to_out.0', 'to_q', 'to_v'] in the file; train.lora_rank 8 and "
            "train.lora_targets ['to_k', 'to_out.0', 'to_q', 'to_v'] configured",
        ),
        (
            4,
            ["to_q", "to_k"],
            "rank 4 and targets ['to_k', 'to_out.0', 'to_q', 'to_v'] in the file; "
            "train.lora_rank 4 and train.lora_targets ['to_k', 'to_q'] configured",
        ),
    ],
)
def test_lora_init_that_does_not_fit_the_config_is_one_line(
    lora_file: tuple[Path, dict[str, torch.Tensor]], rank: int, targets: list[str], line: str
) -> None:
    path, _ = lora_file
    model = adapted(2, rank, targets)
    before = adapters(model)
    with pytest.raises(FluxClusterError) as caught:
        M.load_lora_init(model, path, rank, targets)
    assert str(caught.value) == f"train.lora_init: {path}: {line}"
    assert all(torch.equal(v, before[k]) for k, v in adapters(model).items())  # nothing half-loaded


def test_lora_init_from_a_deeper_model_names_the_modules_it_lacks(
    lora_file: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    path, _ = lora_file
    tensors = load_file(path)
    tensors["transformer.transformer_blocks.9.attn.to_q.lora_A.weight"] = torch.zeros(4, 8)
    save_file(tensors, tmp_path / "deeper.safetensors")
    with pytest.raises(
        FluxClusterError, match=r"modules the model lacks \['transformer_blocks.9.attn.to_q'\]"
    ):
        M.load_lora_init(adapted(2), tmp_path / "deeper.safetensors", 4, TARGETS)


@pytest.mark.parametrize("content", [b"not a safetensors file", None])
def test_lora_init_that_is_no_lora_file_is_one_line(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "weights.safetensors"
    if content is None:
        save_file({"proj_out.weight": torch.zeros(2, 2)}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(FluxClusterError) as caught:
        M.load_lora_init(adapted(2), path, 4, TARGETS)
    message = str(caught.value)
    assert message.startswith(f"train.lora_init: {path}: ") and "\n" not in message
    assert ("not a readable safetensors file" if content else "no LoRA weights in it") in message


def test_a_missing_optimizer_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prodigyopt", None)  # what an environment without it imports
    with pytest.raises(
        FluxClusterError, match=r"^train.optimizer 'prodigy' needs the Python package prodigyopt"
    ):
        build_optimizer("prodigy", [torch.nn.Parameter(torch.zeros(2))], 1.0, torch.device("cpu"))
