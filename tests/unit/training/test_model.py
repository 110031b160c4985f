"""The FLUX transformer pieces on one process: latent packing, meta-device init, the FLOP formula against
torch's FLOP counter, and LoRA (only adapters train; the saved adapter reloads exactly)."""

from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from flux_cluster.config.workload import ModelArgs, load_workload
from flux_cluster.errors import FluxClusterError
from flux_cluster.training import model as M
from flux_cluster.training.flops import FLUX_SCHNELL, NVIDIA_TFLOP_PER_SAMPLE, training_flops_per_sample

WORKLOAD, _ = load_workload("flux1")
TINY = WORKLOAD.models["tiny"]
TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def inputs(args: ModelArgs, batch: int, latent: int, text: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(1)
    return (
        torch.randn(batch, 16, latent, latent, generator=generator),
        torch.rand(batch, generator=generator),
        torch.randn(batch, text, args.joint_attention_dim, generator=generator),
        torch.randn(batch, args.pooled_projection_dim, generator=generator),
    )


def test_packing_round_trips_and_groups_2x2_patches() -> None:
    latents = torch.arange(2 * 16 * 4 * 6, dtype=torch.float32).view(2, 16, 4, 6)
    tokens = M.pack_latents(latents)
    assert tokens.shape == (2, 6, 64)
    assert torch.equal(tokens[0, 0, :4], latents[0, 0, :2, :2].flatten())  # channel 0's top-left patch
    assert torch.equal(M.unpack_latents(tokens, 16, 4, 6), latents)
    img_ids, txt_ids = M.position_ids(4, 6, 5, torch.device("cpu"))
    assert img_ids.tolist()[:4] == [[0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0]] and txt_ids.shape == (5, 3)


def test_meta_init_matches_the_constructors_initialisation() -> None:
    torch.manual_seed(0)
    reference = M.build_model(TINY, meta_init=False)
    model = M.build_model(TINY, meta_init=True)
    assert M.is_on_meta(model)
    model.to_empty(device="cpu")
    M.init_weights(model)
    with torch.no_grad():
        for (name, param), (_, expected) in zip(
            model.named_parameters(), reference.named_parameters(), strict=True
        ):
            assert torch.isfinite(param).all(), name
            if param.dim() == 2:  # Linear: the same uniform(+-1/sqrt(fan_in)) law, other draws
                assert param.abs().max() <= 1 / param.shape[1] ** 0.5, name
                assert float(param.std()) == pytest.approx(float(expected.std()), rel=0.25), name
            elif name.split(".")[-2].startswith("norm"):
                assert torch.equal(param, torch.ones_like(param)), name  # RMSNorm weights start at one


@pytest.mark.parametrize(("preset", "batch", "latent", "text"), [("tiny", 4, 16, 16), ("small", 1, 32, 256)])
def test_flop_formula_matches_torchs_flop_counter(preset: str, batch: int, latent: int, text: int) -> None:
    """Forward + backward counted by torch (attention through the math kernel, which it can count) agrees
    with the shape formula to 1%; the formula's extra is the input gradient of the first layers. On the
    meta device: the counter reads the operators' shapes, the same counts as on the CPU with no arithmetic
    (the small preset's step took 9 s of CI)."""
    args = WORKLOAD.models[preset]
    model = M.build_model(args, meta_init=True)
    x, t, t5, clip = (tensor.to("meta") for tensor in inputs(args, batch, latent, text))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        M.predict_velocity(model, x, t, t5, clip, torch.float32).sum().backward()
    measured = counter.get_total_flops() / batch
    formula = training_flops_per_sample(args.shape(), (latent // 2) ** 2, text)
    assert formula == pytest.approx(measured, rel=0.01)


def test_flux_schnell_shape_is_the_benchmark_model() -> None:
    args = WORKLOAD.models["flux-schnell"]
    assert args.shape() == FLUX_SCHNELL
    model = M.build_model(args)  # 11.9B: built on the meta device, no memory
    assert M.is_on_meta(model) and M.parameter_count(model) == pytest.approx(11.9e9, rel=0.01)
    assert training_flops_per_sample(args.shape()) / 1e12 == pytest.approx(NVIDIA_TFLOP_PER_SAMPLE, rel=0.01)


@pytest.fixture
def pretrained(tmp_path: Path) -> Path:
    torch.manual_seed(3)
    M.build_model(TINY).save_pretrained(tmp_path / "base" / "transformer")  # a pipeline-style folder
    return tmp_path / "base"


def test_lora_trains_only_the_adapters_and_reloads_exactly(pretrained: Path, tmp_path: Path) -> None:
    model = M.build_model(TINY, str(pretrained))
    M.add_lora(model, rank=4, alpha=8.0, targets=TARGETS)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(("lora_" in name) == p.requires_grad for name, p in model.named_parameters())
    optimizer = torch.optim.AdamW(trainable, lr=1e-2, weight_decay=0.1)
    x, t, t5, clip = inputs(TINY, 2, 16, 16)
    for _ in range(3):
        optimizer.zero_grad()
        M.predict_velocity(model, x, t, t5, clip, torch.float32).pow(2).mean().backward()
        optimizer.step()
    for name, param in model.named_parameters():
        changed = not torch.equal(param, before[name])
        assert changed == ("lora_" in name), name
    expected = M.predict_velocity(model, x, t, t5, clip, torch.float32)

    path = M.save_lora(M.lora_state_dict(model), M.lora_metadata(model), tmp_path / "adapter")
    assert path.name == "pytorch_lora_weights.safetensors"
    reloaded = M.load_pretrained(pretrained)
    plain = M.predict_velocity(reloaded, x, t, t5, clip, torch.float32)
    reloaded.load_lora_adapter(str(path.parent), weight_name=path.name, prefix="transformer")
    assert torch.equal(M.predict_velocity(reloaded, x, t, t5, clip, torch.float32), expected)
    assert not torch.allclose(plain, expected)  # the adapter does something


def test_a_folder_without_a_diffusers_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FluxClusterError, match=r"no diffusers config\.json"):
        M.load_pretrained(tmp_path)


def test_guidance_distilled_checkpoints_get_a_guidance_value(tmp_path: Path) -> None:
    """FLUX.1-dev-style bases (guidance_embeds) need a guidance input; their real shape is read back."""
    distilled = TINY.model_copy(update={"guidance_embeds": True, "num_layers": 1})
    torch.manual_seed(0)
    M.build_model(distilled).save_pretrained(tmp_path / "dev")
    model = M.load_pretrained(tmp_path / "dev")
    assert ModelArgs.of(model.config) == distilled  # not the tiny preset it was made from
    x, t, t5, clip = inputs(TINY, 2, 16, 16)
    low = M.predict_velocity(model, x, t, t5, clip, torch.float32, guidance_scale=1.0)
    high = M.predict_velocity(model, x, t, t5, clip, torch.float32, guidance_scale=3.5)
    assert low.shape == x.shape and not torch.allclose(low, high)
