"""A LoRA base read a tensor at a time (quantized_base.load_streaming): the same model, adapters and bytes
as the float32 load it replaces, in a fraction of its host memory."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_parallelize import one_rank

from flux_cluster.config.workload import load_workload
from flux_cluster.training import model as M
from flux_cluster.training import quantized_base as Q

TINY = load_workload("flux1")[0].models["tiny"]
TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]

__all__ = ["one_rank"]  # test_parallelize's module fixture: one gloo rank in this process


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny diffusers transformer stored in bf16, as FLUX.1 is published."""
    folder = tmp_path_factory.mktemp("plain")
    torch.manual_seed(0)
    M.build_model(TINY).to(torch.bfloat16).save_pretrained(folder)
    return folder


def old_way(path: Path, precision: str) -> torch.nn.Module:
    """What a LoRA run loaded before: the whole base in float32, then quantized."""
    model = M.load_pretrained(path)
    torch.manual_seed(1)
    M.add_lora(model, 4, 4.0, TARGETS)
    Q.quantize_base(model, precision, torch.bfloat16)
    return model


def new_way(path: Path, precision: str) -> torch.nn.Module:
    model = Q.pretrained_base(path, precision, "lora")
    assert model is not None
    torch.manual_seed(1)
    M.add_lora(model, 4, 4.0, TARGETS)
    Q.quantize_base(model, precision, torch.bfloat16)
    return model


def loss_of(model: torch.nn.Module) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(2, 16, 8, 8, generator=generator)
    t5 = torch.randn(2, 16, TINY.joint_attention_dim, generator=generator)
    clip = torch.randn(2, TINY.pooled_projection_dim, generator=generator)
    out = M.predict_velocity(model, x, torch.rand(2, generator=generator), t5, clip, torch.bfloat16)
    return F.mse_loss(out.float(), x)


@pytest.mark.parametrize("precision", ["bf16", "fp8", "nf4"])
def test_a_streamed_base_is_the_float32_loads_model_byte_for_byte(plain: Path, precision: str) -> None:
    old, new = old_way(plain, precision), new_way(plain, precision)
    before, after = old.state_dict(), new.state_dict()
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert after[key].dtype == value.dtype and torch.equal(after[key], value), key
    adapters = [p for name, p in new.named_parameters() if "lora_" in name]
    assert adapters and all(p.dtype == torch.float32 and p.requires_grad for p in adapters)
    assert new.training is old.training
    assert torch.equal(loss_of(new), loss_of(old))


def test_a_streamed_pre_quantized_checkpoint_keeps_its_stored_bytes(plain: Path, tmp_path: Path) -> None:
    written = Q.save_quantized(plain, tmp_path / "nf4", "nf4")
    model = Q.pretrained_base(written, "nf4", "lora")
    assert model is not None
    # not dequantized: the linear weights wait as their stored bytes until quantize_base
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    waiting = [getattr(m.weight, Q._READ) for m in linears if m.in_features % Q.NF4_BLOCK == 0]
    assert waiting and all(read[1][0].dtype == torch.uint8 for read in waiting)
    old = old_way(plain, "nf4")
    torch.manual_seed(1)
    M.add_lora(model, 4, 4.0, TARGETS)
    Q.quantize_base(model, "nf4", torch.bfloat16)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in old.state_dict().items())


# ---- host memory: a ~45M-parameter base (180 MB in float32) stored in bf16


def peak_growth(load) -> int:  # type: ignore[no-untyped-def]
    """The most bytes torch's CPU allocator held at once for ``load()`` beyond what it held before (its
    memory events, as the profiler records them: independent of what the process ran before)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = load()
    assert model is not None
    events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
    changes = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = peak = 0
    for _, change in changes:
        live += change
        peak = max(peak, live)
    return peak


def test_a_streamed_nf4_base_peaks_far_below_its_float32_size(tmp_path: Path) -> None:
    from diffusers import FluxTransformer2DModel

    shape = {"num_layers": 3, "num_single_layers": 4, "attention_head_dim": 128, "num_attention_heads": 4}
    shape |= {"joint_attention_dim": 512, "pooled_projection_dim": 128, "in_channels": 64}
    torch.manual_seed(0)
    with torch.device("meta"):
        params = sum(p.numel() for p in FluxTransformer2DModel(**shape).parameters())
    FluxTransformer2DModel(**shape).to(torch.bfloat16).save_pretrained(tmp_path)
    float32 = 4 * params
    new = peak_growth(lambda: Q.pretrained_base(tmp_path, "nf4", "lora"))
    old = peak_growth(lambda: M.load_pretrained(tmp_path))
    print(
        f"{params / 1e6:.1f}M parameters, float32 {float32 / 1e6:.0f} MB: peak +{new / 1e6:.0f} MB "
        f"streamed nf4, +{old / 1e6:.0f} MB float32 load"
    )
    assert old > float32  # the float32 load holds the whole model
    # nf4 is 0.14 of float32, plus one layer's temporaries (its float32 copy, bucket indices)
    assert new < 0.4 * float32


# ---- resume: a stopped run on an nf4 base continues as if it had not stopped


def trainer(path: Path, adapter_seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """As build_trainer makes it: the base streamed, adapters seeded, quantized, sharded, adamw."""
    from flux_cluster.training.optimizers import build_optimizer
    from flux_cluster.training.parallelize import make_mesh, parallelize

    model = Q.pretrained_base(path, "nf4", "lora")
    assert model is not None
    torch.manual_seed(adapter_seed)
    M.add_lora(model, 4, 4.0, TARGETS)
    Q.quantize_base(model, "nf4", torch.bfloat16)
    cpu = torch.device("cpu")
    gpu_like = {"param_dtype": torch.bfloat16, "activation_checkpointing": "full", "compile_blocks": False}
    parallelize(model, make_mesh(cpu, 1, 1), cpu, **gpu_like)  # type: ignore[arg-type]
    params = [p for p in model.parameters() if p.requires_grad]
    return model, build_optimizer("adamw", params, 1e-2, cpu)


def steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, count: int) -> list[float]:
    losses = []
    for _ in range(count):
        loss = loss_of(model)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_a_stopped_nf4_lora_run_resumes_to_the_uninterrupted_losses(
    one_rank: None, plain: Path, tmp_path: Path
) -> None:
    from flux_cluster.training.checkpoint import Checkpointer

    uninterrupted = steps(*trainer(plain, 1), 4)
    model, optimizer = trainer(plain, 1)
    first = steps(model, optimizer, 2)
    checkpoints = Checkpointer(tmp_path, keep=1, rank=0, world_size=1, frozen_base=True)
    saved = checkpoints.save(2, model, optimizer, {}, {})
    # adapters and their optimizer state only: the quantized base is made again from the pretrained one
    import torch.distributed.checkpoint as dcp

    stored = [
        k for k in dcp.FileSystemReader(saved).read_metadata().state_dict_metadata if k.startswith("model.")
    ]
    assert stored and all("lora_" in key for key in stored)
    model, optimizer = trainer(plain, 2)  # other adapters: the checkpoint must bring them back
    checkpoints.load(saved, model, optimizer)
    assert first + steps(model, optimizer, 2) == uninterrupted
