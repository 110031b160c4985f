"""The per-GPU memory estimate (flux_cluster/training/memory.py): its meta-device measurement equals a real
run, checkpointing modes order as they must, the sharded part scales with the FSDP group, and the
4+8-block model's estimate agrees with what an H100 showed."""

import itertools

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from flux_cluster.config.workload import load_workload
from flux_cluster.training.memory import (
    WRAPPINGS,
    auto_order,
    block_kept_bytes,
    choose_checkpointing,
    estimate_memory,
    model_kept_bytes,
    parameter_counts,
)
from flux_cluster.training.model import build_model, parameter_count

MODELS = load_workload("flux1")[0].models
TINY, SCHNELL = MODELS["tiny"], MODELS["flux-schnell"]
SMALL_SHAPE = (2, 64, 16)  # micro-batch, image tokens (a 16x16 latent), text tokens


def saved_by_autograd(kind: str) -> int:
    """What autograd saves for one plain tiny block on the CPU, seen through saved_tensors_hooks (storages
    counted once, parameters and the inputs all blocks share left out), with CPU flash attention."""
    torch.manual_seed(0)
    model = build_model(TINY.model_copy(update={"num_layers": 1, "num_single_layers": 1}))
    block = model.transformer_blocks[0] if kind == "double" else model.single_transformer_blocks[0]
    b, image, text = SMALL_SHAPE
    hidden = torch.randn(b, image, TINY.hidden, requires_grad=True)
    context = torch.randn(b, text, TINY.hidden, requires_grad=True)
    temb = torch.randn(b, TINY.hidden, requires_grad=True)
    rotary = tuple(torch.randn(image + text, TINY.attention_head_dim) for _ in range(2))
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), temb, *rotary]}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        block(hidden, context, temb, rotary)
    return sum(saved.values())


@pytest.mark.parametrize("kind", ["double", "single"])
def test_the_meta_measurement_equals_a_real_cpu_run(kind: str) -> None:
    """float32: on the CPU, layer norm keeps bf16 statistics for bf16 inputs where meta (like CUDA) keeps
    float32, so only float32 compares exactly."""
    for wrapping in WRAPPINGS:
        meta = block_kept_bytes(TINY, kind, *SMALL_SHAPE, torch.float32, wrapping, "meta")
        assert meta == block_kept_bytes(TINY, kind, *SMALL_SHAPE, torch.float32, wrapping, "cpu") > 0
    # ...and what the tracker counts for a plain block is exactly what autograd saves.
    assert block_kept_bytes(TINY, kind, *SMALL_SHAPE, torch.float32) == saved_by_autograd(kind)
    # A checkpointed block keeps only its own inputs: image and text hidden states.
    b, image, text = SMALL_SHAPE
    inputs = b * (image + text) * TINY.hidden * 4
    assert block_kept_bytes(TINY, kind, *SMALL_SHAPE, torch.float32, "full") == inputs
    whole = [model_kept_bytes(TINY, *SMALL_SHAPE, torch.float32, device) for device in ("meta", "cpu")]
    assert whole[0] == whole[1] > 0


def test_each_block_checkpointed_whole_under_ops_plus_n_keeps_less_down_to_full() -> None:
    blocks = SCHNELL.num_layers + SCHNELL.num_single_layers
    ladder = [estimate_memory(SCHNELL, 8, 16, "ops" if n == 0 else f"ops+{n}") for n in range(blocks + 1)]
    kept = [estimate.activations_gb for estimate in ladder]
    assert all(later < earlier for earlier, later in itertools.pairwise(kept))
    assert ladder[-1] == estimate_memory(SCHNELL, 8, 16, "full")  # every block whole is full
    assert estimate_memory(SCHNELL, 8, 16, f"ops+{blocks + 5}") == ladder[-1]
    assert auto_order(SCHNELL) == ("none", "ops", *(f"ops+{n}" for n in range(1, blocks)), "full")


def test_checkpointing_modes_order_by_the_activations_they_keep() -> None:
    modes = ("full", "alternate", "single", "ops", "none")
    kept = {mode: estimate_memory(SCHNELL, 8, 8, mode).activations_gb for mode in modes}
    assert kept["full"] < kept["alternate"] < kept["none"]
    assert kept["full"] < kept["single"] < kept["none"]
    assert kept["full"] < kept["ops"] < kept["none"]
    # Whole-block checkpointing keeps only block inputs: a small fraction of what plain blocks keep.
    assert kept["none"] > 10 * kept["full"] > 0


def test_weights_and_optimizer_are_16_bytes_per_parameter_sharded_over_the_group() -> None:
    parameters = parameter_count(build_model(SCHNELL, meta_init=True))
    assert 11.8e9 < parameters < 12.0e9
    estimates = {world: estimate_memory(SCHNELL, world, 8, "full") for world in (8, 16, 32, 64)}
    for world, estimate in estimates.items():
        assert estimate.weights_and_optimizer_gb == pytest.approx(16 * parameters / world / 1e9, rel=1e-12)
        # Only the sharded part depends on the group size.
        assert estimate.gathered_params_gb == estimates[8].gathered_params_gb
        assert estimate.activations_gb == estimates[8].activations_gb
        assert estimate.gradients_gb == pytest.approx(4 * parameters / world / 1e9, rel=1e-12)
        # activations count where they exceed the gradients that replace them in the backward
        extra = max(estimate.activations_gb - estimate.gradients_gb, 0)
        parts = estimate.weights_and_optimizer_gb + estimate.gathered_params_gb + extra
        assert estimate.total_gb == pytest.approx(parts)
    assert estimates[8].weights_and_optimizer_gb == pytest.approx(2 * estimates[16].weights_and_optimizer_gb)


MEASURED_H200_GB = {"full": 42.9, "ops": 45.1, "ops+2": 43.3, "none": 54.5, "alternate": 44.8}
"""Compiled peaks (max_memory_allocated) on one H200, flux-schnell width with 4+8 blocks, micro-batch 32
(docs/benchmarks.md; none and alternate measured before parallelize.reduce_dtype, 0.7 GB more)."""


@pytest.mark.parametrize("mode", sorted(MEASURED_H200_GB))
def test_the_compiled_estimate_is_within_10_percent_of_the_h200_peaks(mode: str) -> None:
    reduced = SCHNELL.model_copy(update={"num_layers": 4, "num_single_layers": 8})
    estimate = estimate_memory(reduced, 1, 32, mode).total_gb
    assert estimate == pytest.approx(MEASURED_H200_GB[mode], rel=0.10)


def test_the_eager_estimate_is_above_the_compiled_one_and_held_gradients_add_to_it() -> None:
    """On one H100 the same model without checkpointing ran out of its 80 GB eager; compiled, it peaked
    at 54.5 GB. Eager blocks keep more; gradients held through the forward (accumulation) add on top."""
    reduced = SCHNELL.model_copy(update={"num_layers": 4, "num_single_layers": 8})
    compiled = estimate_memory(reduced, 1, 32, "none")
    eager = estimate_memory(reduced, 1, 32, "none", compiled=False)
    held = estimate_memory(reduced, 1, 32, "none", compiled=False, gradients_held=True)
    assert compiled.total_gb < eager.total_gb < held.total_gb < 100
    # ... and accumulating on one rank keeps the reduce copy in float32 (parallelize.reduce_dtype)
    copy = max(parameter_counts(reduced).double, parameter_counts(reduced).single) * 2 / 1e9
    assert held.gathered_params_gb - eager.gathered_params_gb == pytest.approx(copy)
    assert held.gradients_gb == 0
    assert held.total_gb - eager.total_gb == pytest.approx(eager.gradients_gb + copy)


@pytest.mark.parametrize(
    ("gpu_gb", "mode"),
    [(80, "none"), (70, "ops"), (55, "ops+8"), (40, "ops+37"), (20, "full")],
)
def test_auto_checkpointing_takes_the_least_recompute_that_fits(gpu_gb: float, mode: str) -> None:
    """flux-schnell over 8 ranks at micro-batch 16 estimates none 67.7 > ops 52.5 > ops+8 49.1 > ...
    ops+37 35.9 > ... full 28.1 GB: 'auto' takes the first in that order under 90% of the GPU's memory
    (each ops+N one more block checkpointed whole), and full (the least memory there is) when none fits."""
    choice = choose_checkpointing(SCHNELL, 8, 16, gpu_gb)
    assert choice.mode == mode
    assert choice.budget_gb == pytest.approx(0.9 * gpu_gb)
    assert choice.estimate_gb == estimate_memory(SCHNELL, 8, 16, mode).total_gb
    order = auto_order(SCHNELL)
    for earlier in order[: order.index(mode)]:  # less recompute does not fit
        assert estimate_memory(SCHNELL, 8, 16, earlier).total_gb > choice.budget_gb
    fits = choice.estimate_gb <= choice.budget_gb
    assert fits == (gpu_gb != 20)
    assert f"auto -> {mode}: estimated peak {choice.estimate_gb:.1f} GB" in choice.describe()
    assert ("no mode fits" in choice.describe()) == (not fits)


def test_auto_checkpointing_without_the_gpus_memory_is_full() -> None:
    """A system without gpu_memory_gb (CPU, local) gets what the default was before 'auto': full."""
    choice = choose_checkpointing(SCHNELL, 8, 16, None)
    assert choice.mode == "full" and "no gpu_memory_gb" in choice.describe()


def test_a_lora_runs_estimate_counts_its_base_at_its_precision_and_16_bytes_per_adapter() -> None:
    from flux_cluster.training.memory import LoraShape, adapter_counts
    from flux_cluster.training.model import add_lora

    targets = ("to_q", "to_k", "to_v", "to_out.0")
    model = build_model(TINY, meta_init=True)
    add_lora(model, 4, 4.0, list(targets))
    adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert adapter_counts(TINY, 4, targets).total(TINY) == adapters  # what peft adds
    base = parameter_count(build_model(TINY, meta_init=True))
    # on 2 GPUs: a bf16 base is sharded, a quantized one (buffers) whole on each
    gathered = {}
    for precision, per_gpu in (("bf16", 2 / 2), ("fp8", 1), ("nf4", 0.5625)):
        estimate = estimate_memory(TINY, 2, 1, "full", lora=LoraShape(4, targets, precision))
        assert estimate.weights_and_optimizer_gb == pytest.approx((per_gpu * base + 16 * adapters / 2) / 1e9)
        assert estimate.gradients_gb == pytest.approx(4 * adapters / 2 / 1e9)
        gathered[precision] = estimate.gathered_params_gb
    # FSDP2 gathers a bf16 base's blocks (two at once) but never a quantized one's (buffers), and a LoRA
    # run has gradients for its adapters only: less than training every weight gathers
    blocks = parameter_counts(TINY)
    base_gathered = 2 * max(blocks.double, blocks.single) * 2 / 1e9
    assert gathered["fp8"] == gathered["nf4"]
    assert gathered["bf16"] - gathered["nf4"] == pytest.approx(base_gathered)
    assert gathered["bf16"] < estimate_memory(TINY, 2, 1, "full").gathered_params_gb


def test_auto_checkpointing_counts_the_datasets_tokens_and_a_lora_base() -> None:
    from flux_cluster.config.loader import load_system
    from flux_cluster.config.workload import resolve_training
    from flux_cluster.training.memory import resolve_checkpointing

    def estimate(tokens: tuple[int, int] | None, *sets: str) -> float:
        sets = ("train.activation_checkpointing=auto", "train.micro_batch_size=1", *sets)
        choice = resolve_checkpointing(
            resolve_training(load_system("dgx_h100x8", list(sets)).config), 1, tokens
        )[1]
        assert choice is not None and choice.mode == "full"  # 1 GB: nothing fits, full's estimate is shown
        return choice.estimate_gb

    flux1 = estimate(None)
    assert estimate((256, 256)) == flux1
    # a Kontext dataset: its control tokens double the image tokens, and the activations with them
    assert estimate((512, 256)) > flux1 + 0.5 * (flux1 - estimate((16, 256)))
    lora = ("train.mode=lora", "train.pretrained_path=/x", "train.base_precision=nf4")
    # the frozen base at half a byte (whole on each of the 8 GPUs), not 16 bytes per parameter over 8
    assert estimate(None, *lora) < flux1 / 2
