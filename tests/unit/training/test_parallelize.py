"""How the job shards, checkpoints and compiles the FLUX blocks, on one gloo rank in this process: the
arrangement that avoids the bf16 recomputation failure of torch < 2.13, every checkpointing mode giving
the same gradients as none, diffusers' names kept for state dicts and LoRA, and the attention kernel."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode

from flux_cluster.config.workload import ModelArgs, load_workload
from flux_cluster.training import model as M
from flux_cluster.training.attention import allowed_backends, attention_backend, probe_backend
from flux_cluster.training.parallelize import block_wrappings, make_mesh, parallelize, transformer_blocks

TINY = load_workload("flux1")[0].models["tiny"]
CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def sharded(
    mode: str, dtype: torch.dtype, seed: int = 0, precision: str = "bf16", args: ModelArgs = TINY
) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = M.build_model(args)
    return parallelize(
        model,
        make_mesh(CPU, 1, 1),
        CPU,
        param_dtype=dtype,
        activation_checkpointing=mode,
        compile_blocks=False,
        precision=precision,
    )


def batch(size: int = 2) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(7)
    return (
        torch.randn(size, 16, 16, 16, generator=generator),
        torch.rand(size, generator=generator),
        torch.randn(size, 16, TINY.joint_attention_dim, generator=generator),
        torch.randn(size, TINY.pooled_projection_dim, generator=generator),
    )


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    @property
    def names(self) -> set[str]:
        return set(self.calls)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.calls[func.__name__] = self.calls.get(func.__name__, 0) + 1
        return func(*args, **(kwargs or {}))


def loss_of(model: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
    x, t, t5, clip = batch()
    return F.mse_loss(M.predict_velocity(model, x, t, t5, clip, dtype).float(), x)


def test_which_blocks_each_mode_checkpoints() -> None:
    assert block_wrappings("full", 2, 3) == ["full"] * 5 and block_wrappings("ops", 2, 3) == ["ops"] * 5
    assert block_wrappings("none", 2, 3) == ["plain"] * 5
    assert block_wrappings("single", 2, 3) == ["plain", "plain", "full", "full", "full"]
    assert block_wrappings("alternate", 2, 3) == ["full", "plain", "full", "plain", "full"]
    # ops+N: the first single-stream blocks whole (their backward runs last), then the first double ones
    assert block_wrappings("ops+2", 2, 3) == ["ops", "ops", "full", "full", "ops"]
    assert block_wrappings("ops+4", 2, 3) == ["full", "ops", "full", "full", "full"]
    assert block_wrappings("ops+5", 2, 3) == block_wrappings("ops+9", 2, 3) == ["full"] * 5
    with pytest.raises(ValueError, match="'auto'"):
        block_wrappings("auto", 2, 3)


def test_checkpointing_sits_inside_each_fsdp_unit_and_recomputes_in_the_compute_dtype() -> None:
    """The GPU default (bf16 + full checkpointing). On torch < 2.13, checkpointing around the FSDP unit
    (diffusers' enable_gradient_checkpointing) recomputed from float32 inputs what the forward had run in
    bf16, and backward failed. Here the wrapper is inside the unit: the block's forward and its
    recomputation both start from the bf16 inputs FSDP cast."""
    model = sharded("full", torch.bfloat16)
    assert not model.gradient_checkpointing  # diffusers' own checkpointing stays off
    entries: dict[int, list[torch.dtype]] = {}
    for index, unit in enumerate(transformer_blocks(model)):
        assert isinstance(unit, FSDPModule) and isinstance(unit, CheckpointWrapper)
        inner = unit._checkpoint_wrapped_module
        inner.register_forward_pre_hook(
            lambda _m, args, kwargs, i=index: entries.setdefault(i, []).append(kwargs["hidden_states"].dtype),
            with_kwargs=True,
        )
    loss = loss_of(model, torch.bfloat16)
    assert all(len(seen) == 1 for seen in entries.values())
    loss.backward()
    assert len(entries) == 4 and all(seen == [torch.bfloat16, torch.bfloat16] for seen in entries.values())
    assert all(p.grad is not None and torch.isfinite(p.grad.full_tensor()).all() for p in model.parameters())


@pytest.mark.parametrize("mode", ["full", "alternate", "single", "ops", "ops+1"])
def test_every_checkpointing_mode_gives_the_gradients_of_none(mode: str) -> None:
    reference, model = sharded("none", torch.float32), sharded(mode, torch.float32)
    wrapped = [isinstance(unit, CheckpointWrapper) for unit in transformer_blocks(model)]
    wrappings = block_wrappings(mode, len(model.transformer_blocks), len(model.single_transformer_blocks))
    assert wrapped == [wrapping != "plain" for wrapping in wrappings]
    loss_of(reference, torch.float32).backward()
    loss_of(model, torch.float32).backward()
    for (name, expected), (_, got) in zip(
        reference.named_parameters(), model.named_parameters(), strict=False
    ):
        assert torch.equal(expected.grad.full_tensor(), got.grad.full_tensor()), name


def test_sharded_gradients_equal_the_plain_models_so_the_view_warning_is_harmless() -> None:
    """The blocks and the model return views, and FSDP2 warns that an in-place op on one would skip its
    pre-backward all-gather (parallelize.py filters that warning). Nothing changes them in place: the
    sharded model's gradients equal the unsharded model's (to float rounding), so every all-gather ran."""
    torch.manual_seed(0)
    plain = M.build_model(TINY)
    loss_of(plain, torch.float32).backward()
    model = sharded("none", torch.float32)
    loss_of(model, torch.float32).backward()
    for (name, expected), (_, got) in zip(plain.named_parameters(), model.named_parameters(), strict=True):
        torch.testing.assert_close(got.grad.full_tensor(), expected.grad, rtol=1e-5, atol=1e-8, msg=name)


def saved_bytes(model: torch.nn.Module) -> int:
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss_of(model, torch.bfloat16)
    return total


def test_checkpointing_modes_keep_less_for_the_backward_pass() -> None:
    kept = {
        mode: saved_bytes(sharded(mode, torch.bfloat16)) for mode in ("none", "single", "alternate", "full")
    }
    assert kept["full"] < kept["alternate"] < kept["none"] and kept["full"] < kept["single"] < kept["none"]


def matmuls_in_a_step(mode: str) -> int:
    model = sharded(mode, torch.bfloat16)
    with _Ops() as ops:
        loss_of(model, torch.bfloat16).backward()
    return sum(count for name, count in ops.calls.items() if name.split(".")[0] in ("mm", "addmm", "bmm"))


def test_selective_checkpointing_recomputes_no_matmul() -> None:
    """'ops' keeps matmul and attention outputs (outside autograd's saved tensors, so not counted
    above) and recomputes only the cheap ops; 'full' runs every block's matmuls again."""
    none, ops, full = matmuls_in_a_step("none"), matmuls_in_a_step("ops"), matmuls_in_a_step("full")
    assert ops == none < full
    # ops+N: only its whole blocks run their matmuls again (TINY: 2 double- and 2 single-stream blocks)
    one_single, both_single = matmuls_in_a_step("ops+1"), matmuls_in_a_step("ops+2")
    assert none < one_single < both_single < full
    assert both_single - none == 2 * (one_single - none)


def test_fp8_trains_every_block_linear_in_float8_under_checkpointing(monkeypatch: pytest.MonkeyPatch) -> None:
    """train.precision 'fp8' (torchao float8 training; GPU-fast only, same numerics on CPU): the blocks'
    linears run scaled FP8 matmuls, also when recomputed, the embedders and head stay bf16, and the loss
    stays near the bf16 model's."""
    from torchao.float8.float8_linear import Float8Linear

    model = sharded("full", torch.bfloat16, precision="fp8")
    for unit in transformer_blocks(model):
        assert any(isinstance(m, Float8Linear) for m in unit.modules())
    assert not any(isinstance(m, Float8Linear) for m in model.proj_out.modules())
    scaled_mm, calls = torch._scaled_mm, []
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **kw: calls.append(a[0].dtype) or scaled_mm(*a, **kw))
    loss = loss_of(model, torch.bfloat16)
    forward = len(calls)
    loss.backward()
    assert forward > 0 and torch.float8_e4m3fn in calls
    assert len(calls) == 4 * forward  # recomputed forward, then grad-input and grad-weight GEMMs
    monkeypatch.undo()
    assert all(p.grad is not None and torch.isfinite(p.grad.full_tensor()).all() for p in model.parameters())
    reference = loss_of(sharded("full", torch.bfloat16), torch.bfloat16)
    assert abs(loss.item() - reference.item()) < 0.05 * reference.item()


def test_state_dicts_and_lora_keep_diffusers_names(tmp_path: Path) -> None:
    plain = M.build_model(TINY)
    model = sharded("full", torch.bfloat16)
    assert any("_checkpoint_wrapped_module" in name for name, _ in model.named_parameters())
    assert set(get_model_state_dict(model)) == set(plain.state_dict())  # DCP checkpoints, saved weights

    torch.manual_seed(0)
    base = M.build_model(TINY)
    M.add_lora(base, rank=4, alpha=4.0, targets=["to_q", "to_k", "to_v", "to_out.0"])
    expected = set(M.lora_state_dict(base))
    torch.manual_seed(0)
    lora = M.build_model(TINY)
    M.add_lora(lora, rank=4, alpha=4.0, targets=["to_q", "to_k", "to_v", "to_out.0"])
    parallelize(
        lora,
        make_mesh(CPU, 1, 1),
        CPU,
        param_dtype=torch.bfloat16,
        activation_checkpointing="full",
        compile_blocks=False,
    )
    assert set(M.lora_state_dict(lora)) == expected and all("_checkpoint" not in key for key in expected)


def test_auto_attention_never_picks_cudnn() -> None:
    gpu = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    assert allowed_backends("auto", "cuda") == gpu  # CUDA and ROCm builds alike ("cuda" device type)
    assert allowed_backends("auto", "cpu") == [SDPBackend.MATH]
    assert allowed_backends("cudnn", "cuda") == [SDPBackend.CUDNN_ATTENTION]
    assert allowed_backends("flash", "cpu") == [SDPBackend.FLASH_ATTENTION]


@pytest.mark.parametrize(("choice", "kernel"), [("auto", "math"), ("flash", "flash"), ("math", "math")])
def test_the_attention_backend_applies_to_forward_and_recomputation(choice: str, kernel: str) -> None:
    assert probe_backend(choice, CPU, torch.bfloat16, 4, 32, 80) == kernel
    model = sharded("full", torch.bfloat16)
    with attention_backend(choice, CPU), _Ops() as ops:
        loss_of(model, torch.bfloat16).backward()  # the backward recomputes every block's attention
    flash = any("flash_attention" in name for name in ops.names)
    assert flash == (kernel == "flash"), sorted(ops.names)


def test_an_attention_backend_that_cannot_run_is_one_line() -> None:
    with pytest.raises(RuntimeError) as caught:
        probe_backend("cudnn", CPU, torch.bfloat16, 4, 32, 80)
    message = str(caught.value)
    assert message.startswith(
        "train.attention_backend 'cudnn' cannot run attention on cpu (bfloat16, 4 heads x 32)"
    )
    assert "\n" not in message


@pytest.mark.parametrize(
    ("mode", "recipe"), [("full", "tensorwise"), ("ops", "rowwise"), ("ops+1", "tensorwise")]
)
def test_fp8_blocks_compile_whole_under_checkpointing_and_fsdp(
    monkeypatch: pytest.MonkeyPatch, mode: str, recipe: str
) -> None:
    """Each fp8 block, checkpoint-wrapped and sharded as the job does it, compiles to one graph (torchao's
    float8 casts and amax reductions inside it, no graph break), one per block kind. Dynamo's tracing is
    what breaks graphs, so its 'eager' backend proves it without inductor's minutes."""
    from torch._dynamo.utils import counters

    compile_module = torch.nn.Module.compile
    monkeypatch.setattr(
        torch.nn.Module, "compile", lambda self, **kw: compile_module(self, backend="eager", **kw)
    )
    torch._dynamo.reset()
    graphs_before, breaks_before = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    torch.manual_seed(0)
    model = M.build_model(TINY.model_copy(update={"num_layers": 1, "num_single_layers": 1}))
    parallelize(
        model,
        make_mesh(CPU, 1, 1),
        CPU,
        param_dtype=torch.bfloat16,
        activation_checkpointing=mode,
        compile_blocks=True,
        precision="fp8",
        fp8_recipe=recipe,
    )
    loss_of(model, torch.bfloat16).backward()
    assert sum(counters["graph_break"].values()) == breaks_before, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] - graphs_before == 2  # the double- and single-stream block
    assert all(p.grad is not None for p in model.parameters())
    torch._dynamo.reset()


class _ReduceBuffers(TorchDispatchMode):
    """The dtypes of the buffers FSDP2 copies a block's gradients into for its reduce."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if "chunk_cat" in str(func):  # torch._chunk_cat, or torch.ops.fsdp.chunk_cat (2.13)
            self.dtypes.add((kwargs or {})["out"].dtype)
        return func(*args, **(kwargs or {}))


def test_one_rank_copies_gradients_for_the_reduce_in_bf16_and_trains_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One rank reduces nothing: FSDP2 copies each block's bf16 gradients into a reduce-dtype buffer and
    holds it until the next block's reduce. In bf16 that buffer is half the float32 one (0.68 GB less
    held at a flux-schnell double block), and the float32 gradients, losses and weights are the same."""
    from flux_cluster.training import parallelize as P

    def train(reduce: torch.dtype | None) -> tuple[list[float], set[torch.dtype], list[torch.Tensor]]:
        if reduce is not None:  # as before: float32 on every mesh
            monkeypatch.setattr(P, "reduce_dtype", lambda *_: reduce)
        model = sharded(
            "full", torch.bfloat16, args=TINY.model_copy(update={"num_layers": 1, "num_single_layers": 1})
        )
        monkeypatch.undo()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        loss, buffers = loss_of(model, torch.bfloat16), _ReduceBuffers()
        with buffers:
            loss.backward()
        optimizer.step()
        weights = [p.full_tensor() for p in model.parameters()]
        with torch.no_grad():  # and the loss after the step
            losses = [loss.item(), loss_of(model, torch.bfloat16).item()]
        return losses, buffers.dtypes, weights

    losses, dtypes, weights = train(None)
    old_losses, old_dtypes, old_weights = train(torch.float32)
    assert dtypes == {torch.bfloat16} and old_dtypes == {torch.float32}
    assert losses == old_losses
    assert all(
        p.dtype == torch.float32 and torch.equal(p, q) for p, q in zip(weights, old_weights, strict=True)
    )


def test_gradients_summed_over_micro_batches_stay_float32_on_one_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FSDP2 sums unsynced micro-batches' gradients in the reduce dtype: with accumulation one rank keeps
    float32 (the bf16 copy above is only for one micro-batch a step), as the sum in bf16 would round."""
    from torch.distributed.fsdp import FSDPModule

    from flux_cluster.training import parallelize as P

    def accumulated(reduce: str) -> list[torch.Tensor]:
        if reduce != "chosen":
            monkeypatch.setattr(P, "reduce_dtype", lambda *_: None if reduce == "bf16" else torch.float32)
        torch.manual_seed(0)
        model = parallelize(
            M.build_model(TINY.model_copy(update={"num_layers": 1, "num_single_layers": 1})),
            make_mesh(CPU, 1, 1),
            CPU,
            param_dtype=torch.bfloat16,
            activation_checkpointing="full",
            compile_blocks=False,
            accumulation_steps=4,
        )
        monkeypatch.undo()
        assert isinstance(model, FSDPModule)
        for step in range(4):
            model.set_requires_gradient_sync(step == 3)
            (loss_of(model, torch.bfloat16) * (step + 1) / 3).backward()
        return [p.grad.full_tensor() for p in model.parameters() if p.grad is not None]

    chosen, in_float32, in_bf16 = accumulated("chosen"), accumulated("float32"), accumulated("bf16")
    assert all(torch.equal(a, b) for a, b in zip(chosen, in_float32, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(chosen, in_bf16, strict=True))  # what it avoids
