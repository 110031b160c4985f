"""The frozen LoRA base in bf16, fp8 or NF4 (train.base_precision) on one gloo rank: the quantization
error bounds, the bytes it saves (held whole, as buffers FSDP2 leaves alone), gradients reaching only the
adapters through the dequantized weights under checkpointing, 8-bit AdamW stepping them, and the config's
refusals."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from test_parallelize import one_rank

from flux_cluster.config.training import TrainConfig
from flux_cluster.config.workload import ModelArgs, load_workload
from flux_cluster.errors import FluxClusterError
from flux_cluster.safe_text import printable
from flux_cluster.training import model as M
from flux_cluster.training import pretrained as P
from flux_cluster.training import quantized_base as Q
from flux_cluster.training.optimizers import build_optimizer
from flux_cluster.training.parallelize import make_mesh, parallelize

TINY = load_workload("flux1")[0].models["tiny"]
CPU = torch.device("cpu")
TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]

__all__ = ["one_rank"]  # test_parallelize's module fixture: one gloo rank in this process


def test_fp8_per_channel_error_is_within_e4m3s_half_step() -> None:
    generator = torch.Generator().manual_seed(0)
    # rows of very different scales: one scale per output channel keeps each row's relative error
    weight = torch.randn(64, 128, generator=generator) * torch.logspace(-3, 1, 64).unsqueeze(1)
    data, scale = Q.quantize_fp8(weight)
    assert data.dtype == torch.float8_e4m3fn and scale.shape == (64, 1)
    back = Q.dequantize_fp8(data.view(torch.uint8), scale.view(torch.uint8), torch.float32)
    # e4m3 has 3 mantissa bits: relative rounding error <= 2^-4 of normal values; subnormal steps 2^-9 * scale
    bound = weight.abs() * 2**-4 + scale * 2**-9
    assert ((back - weight).abs() <= bound + 1e-12).all()
    assert (back.abs().amax(dim=1) - weight.abs().amax(dim=1)).abs().max() < 1e-6 * weight.abs().max()


def test_nf4_is_bitsandbytes_nf4_byte_for_byte_and_within_half_a_code_gap() -> None:
    import bitsandbytes.functional as bnb

    weight = torch.randn(128, 256, generator=torch.Generator().manual_seed(1))
    packed, absmax = Q.quantize_nf4(weight)
    theirs, state = bnb.quantize_4bit(weight, blocksize=Q.NF4_BLOCK, quant_type="nf4")
    assert torch.equal(packed.view(-1), theirs.view(-1)) and torch.equal(absmax.view(-1), state.absmax)
    assert packed.shape == (128, 128) and absmax.shape == (128, 4)  # blocks within rows: rows shard
    back = Q.dequantize_nf4(packed, absmax.view(torch.uint8), torch.tensor(Q.NF4_CODE), torch.float32)
    assert torch.allclose(back, bnb.dequantize_4bit(theirs, state))
    error = (back - weight).view(-1, Q.NF4_BLOCK).abs()
    # NF4's widest gap is -1 .. -0.6962 (its lowest codes)
    assert (error <= absmax.view(-1, 1) * (1 - 0.6961928) / 2 + 1e-6).all()


def lora_model(
    precision: str, mode: str = "full", seed: int = 0, args: ModelArgs = TINY, compile_blocks: bool = False
) -> tuple[torch.nn.Module, Q.QuantizedBase]:
    torch.manual_seed(seed)
    model = M.build_model(args)
    M.add_lora(model, 4, 4.0, TARGETS)
    with torch.no_grad():  # B != 0, so the adapters change the output
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    base = Q.quantize_base(model, precision, torch.bfloat16)
    gpu_like = {"param_dtype": torch.bfloat16, "activation_checkpointing": mode}
    gpu_like["compile_blocks"] = compile_blocks
    parallelize(model, make_mesh(CPU, 1, 1), CPU, **gpu_like)  # type: ignore[arg-type]
    return model, base


def loss_of(model: torch.nn.Module, part: slice = slice(None)) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(2, 16, 8, 8, generator=generator)[part]
    t = torch.rand(2, generator=generator)[part]
    t5 = torch.randn(2, 16, TINY.joint_attention_dim, generator=generator)[part]
    clip = torch.randn(2, TINY.pooled_projection_dim, generator=generator)[part]
    return F.mse_loss(M.predict_velocity(model, x, t, t5, clip, torch.bfloat16).float(), x)


@pytest.mark.parametrize("precision", ["fp8", "nf4"])
def test_a_quantized_base_trains_only_the_adapters_and_saves_its_bytes(precision: str) -> None:
    reference, bf16 = lora_model("bf16")
    model, base = lora_model(precision)
    assert bf16.quantized == 0 and base.quantized > 0
    # every adapted projection's base layer is quantized (the layers LoRA trains beside)
    quantized = (Q.Float8FrozenLinear, Q.NF4FrozenLinear)
    bases = [m.base_layer for m in model.modules() if hasattr(m, "lora_A")]
    assert bases and all(isinstance(layer, quantized) for layer in bases)
    # bf16 stores the float32 base in half; fp8 and nf4 save most of the linear weights' bytes again
    assert bf16.bytes_after < 0.55 * bf16.bytes_before
    assert base.bytes_after < (0.7 if precision == "fp8" else 0.5) * bf16.bytes_after
    assert Q.parameter_bytes(model) == pytest.approx(base.bytes_after, rel=0.01)  # FSDP2 keeps the format
    # the same function: the quantized base's loss is close to the bf16 base's
    loss, expected = loss_of(model), loss_of(reference)
    assert loss.item() == pytest.approx(expected.item(), rel=0.05 if precision == "fp8" else 0.15)
    loss.backward()
    trained = {name for name, p in model.named_parameters() if p.grad is not None}
    assert trained and all("lora_" in name for name in trained)
    assert all(p.grad.abs().sum() > 0 for name, p in model.named_parameters() if "lora_B" in name)
    assert not any(p.requires_grad for name, p in model.named_parameters() if "lora_" not in name)


STORED = Q.STORED  # one table: the layers' buffers, what models quantize writes and the loader pairs


def quantized_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, Q.Float8FrozenLinear | Q.NF4FrozenLinear)]


@pytest.mark.parametrize("precision", ["fp8", "nf4"])
def test_a_quantized_base_holds_its_bytes_in_buffers_and_only_float_parameters(precision: str) -> None:
    torch.manual_seed(0)
    model = M.build_model(TINY)
    M.add_lora(model, 4, 4.0, TARGETS)
    Q.quantize_base(model, precision, torch.bfloat16)
    # torch < 2.13's fully_shard makes each sharded parameter require gradients first: an integer one raises
    assert all(p.is_floating_point() for p in model.parameters())
    layers = quantized_layers(model)
    assert all(
        {name for name, _ in layer.named_buffers()} - {"code"} == set(STORED[precision]) for layer in layers
    )
    buffers = [dict(layer.named_buffers())[name] for layer in layers for name in STORED[precision]]
    assert layers and all(b.dtype == torch.uint8 for b in buffers)
    # in no state_dict (training checkpoints hold the adapters), but in what models quantize writes
    assert not any(key.endswith(STORED[precision]) for key in model.state_dict())
    assert sum(key.endswith(STORED[precision]) for key in Q.stored_state(model)) == len(buffers)


@pytest.mark.parametrize("precision", ["fp8", "nf4"])
def test_fully_shard_leaves_a_quantized_base_whole_and_its_loss_unchanged(precision: str) -> None:
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = M.build_model(TINY.model_copy(update={"num_layers": 1, "num_single_layers": 1}))
    M.add_lora(model, 4, 4.0, TARGETS)
    Q.quantize_base(model.to(torch.bfloat16), precision, torch.bfloat16)  # as FSDP2 computes: all bf16
    layers = quantized_layers(model)
    before = [{name: t.clone() for name, t in layer.named_buffers()} for layer in layers]
    assert layers and all(set(STORED[precision]) <= stored.keys() for stored in before)
    unsharded = loss_of(model)
    unsharded.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    gpu_like = {"param_dtype": torch.bfloat16, "activation_checkpointing": "none", "compile_blocks": False}
    parallelize(model, make_mesh(CPU, 1, 1), CPU, **gpu_like)  # type: ignore[arg-type]
    for layer, stored in zip(layers, before, strict=True):
        after = dict(layer.named_buffers())
        assert not any(isinstance(t, DTensor) for t in after.values())  # neither sharded nor cast
        assert all(after[name].dtype == t.dtype and torch.equal(after[name], t) for name, t in stored.items())
    sharded = loss_of(model)
    sharded.backward()
    assert sharded.item() == pytest.approx(unsharded.item(), rel=1e-3)  # bf16 either way
    got = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}  # type: ignore[union-attr]
    assert got.keys() == grads.keys() and grads
    assert all(torch.allclose(got[n].float(), g.float(), rtol=0.02, atol=1e-4) for n, g in grads.items())


def test_gradient_accumulation_on_an_nf4_base_gives_the_whole_batchs_gradients() -> None:
    whole, _ = lora_model("nf4")
    loss_of(whole).backward()
    accumulated, _ = lora_model("nf4")
    for micro, part in enumerate((slice(0, 1), slice(1, 2))):  # as train_step: sync on the last only
        accumulated.set_requires_gradient_sync(micro == 1)  # type: ignore[operator]
        (loss_of(accumulated, part) / 2).backward()
    expected = {n: p.grad for n, p in whole.named_parameters() if p.grad is not None}
    got = {n: p.grad for n, p in accumulated.named_parameters() if p.grad is not None}
    assert expected.keys() == got.keys() and expected
    for name, grad in expected.items():
        torch.testing.assert_close(got[name].full_tensor(), grad.full_tensor(), rtol=0.02, atol=1e-5)  # type: ignore[union-attr]


def test_the_quantized_forward_keeps_no_bf16_weight_for_the_backward_pass() -> None:
    linear = torch.nn.Linear(256, 512, bias=False).requires_grad_(False)
    layer = Q.Float8FrozenLinear(linear, torch.bfloat16)
    saved: list[torch.Tensor] = []
    x = torch.randn(4, 256, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = layer(x)
    assert {t.dtype for t in saved} == {torch.uint8}  # only the e4m3 bytes and their scales
    out.float().sum().backward()
    expected = torch.ones(4, 512) @ Q.dequantize_fp8(layer.weight_fp8, layer.weight_scale, torch.float32)
    assert torch.allclose(x.grad.float(), expected, rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("precision", ["fp8", "nf4"])
def test_checkpointing_and_8bit_adamw_compose_with_a_quantized_base(precision: str) -> None:
    model, _ = lora_model(precision, "none")
    checkpointed, _ = lora_model(precision, "full")
    loss, again = loss_of(model), loss_of(checkpointed)
    loss.backward()
    again.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    wrapped = {n.replace("._checkpoint_wrapped_module", ""): p for n, p in checkpointed.named_parameters()}
    assert grads
    for name, grad in grads.items():
        assert torch.equal(grad.full_tensor(), wrapped[name].grad.full_tensor())  # type: ignore[union-attr]
    params = [p for p in checkpointed.parameters() if p.requires_grad]
    before = [p.detach().full_tensor().clone() for p in params]  # type: ignore[attr-defined]
    build_optimizer("adamw8bit", params, 1e-3, CPU).step()
    moved = [not torch.equal(b, p.detach().full_tensor()) for b, p in zip(before, params, strict=True)]  # type: ignore[attr-defined]
    assert any(moved)


def config(**fields: object) -> TrainConfig:
    return TrainConfig(**{"mode": "lora", "pretrained_path": "/x", **fields})  # type: ignore[arg-type]


def test_base_precision_and_caption_dropout_in_the_config() -> None:
    assert config().base_precision == "bf16" and config(base_precision="nf4").base_precision == "nf4"
    for mode in ("finetune", "pretrain"):
        with pytest.raises(ValidationError, match="base_precision 'fp8' needs mode 'lora'"):
            config(mode=mode, base_precision="fp8")
    with pytest.raises(ValidationError, match="base_precision"):
        config(base_precision="int4")
    # caption_dropout is the documented name; cfg_dropout its older one
    assert config().caption_dropout_rate == 0.1
    assert config(caption_dropout=0.3).caption_dropout_rate == 0.3
    assert config(cfg_dropout=0.2).caption_dropout_rate == 0.2
    assert config(cfg_dropout=0.2, caption_dropout=0.2).caption_dropout_rate == 0.2
    with pytest.raises(ValidationError, match=r"caption_dropout 0\.3 and cfg_dropout 0\.2 are one setting"):
        config(cfg_dropout=0.2, caption_dropout=0.3)


def test_caption_dropout_reaches_the_train_loader(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from flux_cluster.config.loader import load_system
    from flux_cluster.config.workload import resolve_training
    from flux_cluster.runtime.dist import DistInfo
    from flux_cluster.training import trainer

    seen: dict[str, object] = {}  # a real loader needs an indexed dataset: what it is given is the point
    monkeypatch.setattr(trainer, "train_loader", lambda root, **kwargs: seen.update(kwargs, root=root))
    for sets, rate in (([], 0.1), (["train.caption_dropout=0.3"], 0.3), (["train.cfg_dropout=0"], 0.0)):
        plan = resolve_training(load_system("local", sets).config)
        trainer.plan_loader(plan, tmp_path, DistInfo(0, 1, 0, "gloo", CPU), seed=1)
        assert seen["cfg_dropout"] == rate and seen["root"] == tmp_path


@pytest.mark.parametrize("precision", ["fp8", "nf4"])
def test_a_pre_quantized_checkpoint_loads_to_the_bytes_quantizing_at_load_makes(
    precision: str, tmp_path: Path
) -> None:
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from flux_cluster.cli import app

    torch.manual_seed(0)
    M.build_model(TINY).save_pretrained(tmp_path / "plain")
    out = tmp_path / precision
    result = CliRunner().invoke(
        app, ["models", "quantize", str(tmp_path / "plain"), str(out), "--precision", precision]
    )
    assert result.exit_code == 0, result.output
    assert f"--set train.base_precision={precision}" in result.output
    assert P.prequantized_precision(out) == precision and P.prequantized_precision(tmp_path / "plain") is None
    stored = load_file(out / "transformer" / P.QUANTIZED_WEIGHTS)
    on_disk = sum(t.numel() * t.element_size() for t in stored.values())
    assert on_disk < (0.6 if precision == "fp8" else 0.35) * sum(
        p.numel() * 2 for p in M.load_pretrained(tmp_path / "plain").parameters()
    )
    # the training path: dequantized, LoRA attached, quantized again: the very bytes stored
    model = P.pretrained_base(out, precision, "lora")
    assert model is not None
    M.add_lora(model, 4, 4.0, TARGETS)
    Q.quantize_base(model, precision, torch.bfloat16)
    again = {k.replace(".base_layer", ""): v for k, v in Q.stored_state(model).items() if "lora_" not in k}
    assert again.keys() == stored.keys()
    assert all(torch.equal(again[k], stored[k]) for k in stored)
    with pytest.raises(
        FluxClusterError, match=f"a base quantized to {precision}: .*train.base_precision {precision}"
    ):
        P.pretrained_base(out, "bf16", "lora")
    with pytest.raises(FluxClusterError, match="got mode 'finetune'"):
        P.pretrained_base(out, precision, "finetune")
    again_cli = CliRunner().invoke(
        app, ["models", "quantize", str(tmp_path / "plain"), str(out), "--precision", precision]
    )
    assert again_cli.exit_code == 2 and "exists; choose a new folder" in again_cli.output


@pytest.fixture(scope="module")
def nf4_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint `models quantize` wrote (nf4), made once for the damage tests."""
    root = tmp_path_factory.mktemp("quantized")
    torch.manual_seed(0)
    M.build_model(TINY).save_pretrained(root / "plain")
    (root / "out.partial").mkdir()  # someone's folder of that name: the old fixed temp name deleted it
    (root / "out.partial" / "keep").write_text("x")
    return P.save_quantized(root / "plain", root / "out", "nf4")


def test_models_quantize_writes_readable_files_through_a_unique_sibling(nf4_checkpoint: Path) -> None:
    from flux_cluster.atomic import _default_mode

    files = [p for p in nf4_checkpoint.rglob("*") if p.is_file()]
    assert {p.name for p in files} == {P.QUANTIZED_WEIGHTS, "config.json"}
    assert all(p.stat().st_mode & 0o777 == _default_mode() for p in files)  # safetensors alone: 0600
    assert (nf4_checkpoint.parent / "out.partial" / "keep").read_text() == "x"
    assert sorted(p.name for p in nf4_checkpoint.parent.iterdir()) == ["out", "out.partial", "plain"]


def _damage(folder: Path, how: str) -> None:
    from safetensors.torch import load_file, save_file

    file, config = folder / "transformer" / P.QUANTIZED_WEIGHTS, folder / "transformer" / "config.json"
    state = load_file(file)
    nf4 = sorted(k for k in state if k.endswith(".weight_nf4"))[0]
    if how == "missing absmax":
        del state[nf4.replace(".weight_nf4", ".weight_absmax")]
    elif how == "absmax shape":
        key = nf4.replace(".weight_nf4", ".weight_absmax")
        state[key] = state[key][:, :4].contiguous()
    elif how == "layer shape":
        key = next(k for k in state if k.endswith("norm.linear.bias"))
        state[key] = torch.zeros(3, dtype=state[key].dtype)
    elif how == "truncated":
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
        return
    elif how == "config":
        config.write_text("{not json")
        return
    elif how == "config bounds":
        config.write_text(json.dumps(json.loads(config.read_text()) | {"num_layers": 10**6}))
        return
    elif how in ("NaN absmax", "zero absmax"):
        key = nf4.replace(".weight_nf4", ".weight_absmax")
        scales = state[key].view(torch.float32).clone()
        scales[0, 0] = float("nan") if how == "NaN absmax" else 0.0
        state[key] = scales.view(torch.uint8)
    elif how == "int tensor":
        key = next(k for k in state if k.endswith("norm.linear.bias"))
        state[key] = state[key].to(torch.int16)
    elif how == "uint8 as float":
        state[nf4] = state[nf4].to(torch.float16)
    metadata = {"base_precision": "\x1b[2J" * 50 if how == "metadata" else "nf4"}
    save_file(state, file, metadata=metadata)


@pytest.mark.parametrize(
    ("how", "named"),
    [
        ("missing absmax", P.QUANTIZED_WEIGHTS),
        ("absmax shape", P.QUANTIZED_WEIGHTS),
        ("layer shape", P.QUANTIZED_WEIGHTS),
        ("truncated", P.QUANTIZED_WEIGHTS),
        ("config", "config.json"),
        ("config bounds", "config.json"),
        ("NaN absmax", P.QUANTIZED_WEIGHTS),
        ("zero absmax", P.QUANTIZED_WEIGHTS),
        ("int tensor", P.QUANTIZED_WEIGHTS),
        ("uint8 as float", P.QUANTIZED_WEIGHTS),
        ("metadata", P.QUANTIZED_WEIGHTS),
    ],
)
def test_a_damaged_pre_quantized_checkpoint_is_one_line_naming_the_file(
    nf4_checkpoint: Path, tmp_path: Path, how: str, named: str
) -> None:
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(nf4_checkpoint, damaged)
    _damage(damaged, how)
    with pytest.raises(FluxClusterError) as caught:
        P.pretrained_base(damaged, "nf4", "lora")
    message = str(caught.value)
    assert str(damaged / "transformer" / named) in message and "\n" not in message
    assert "flux-cluster models quantize" in message and printable(message) == message and len(message) < 600


def test_a_pre_quantized_fp8_weight_with_nan_bytes_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    M.build_model(TINY).save_pretrained(tmp_path / "plain")
    out = P.save_quantized(tmp_path / "plain", tmp_path / "fp8", "fp8")
    file = out / "transformer" / P.QUANTIZED_WEIGHTS
    state = load_file(file)
    key = sorted(k for k in state if k.endswith(".weight_fp8"))[0]
    state[key][0, 0] = 0x7F  # e4m3fn's NaN
    save_file(state, file, metadata={"base_precision": "fp8"})
    with pytest.raises(FluxClusterError, match="NaN weights") as caught:
        P.pretrained_base(out, "fp8", "lora")
    assert str(file) in str(caught.value)


@pytest.mark.parametrize("kept", [0, 1])
def test_a_stored_tensor_without_its_companion_names_both(
    nf4_checkpoint: Path, tmp_path: Path, kept: int
) -> None:
    """The loader pairs each stored tensor with its companion from Q.STORED: either one alone is one line
    naming it and the one it lacks."""
    import shutil

    from safetensors.torch import load_file, save_file

    damaged = tmp_path / "damaged"
    shutil.copytree(nf4_checkpoint, damaged)
    file = damaged / "transformer" / P.QUANTIZED_WEIGHTS
    state = load_file(file)
    names = Q.STORED["nf4"]
    prefix = sorted(k for k in state if k.endswith(f".{names[0]}"))[0].rpartition(".")[0]
    del state[f"{prefix}.{names[1 - kept]}"]
    save_file(state, file, metadata={"base_precision": "nf4"})
    with pytest.raises(FluxClusterError) as caught:
        P.pretrained_base(damaged, "nf4", "lora")
    assert f"{prefix}.{names[kept]} without {prefix}.{names[1 - kept]}" in str(caught.value)


def test_the_parameter_count_of_a_quantized_base_counts_weights_not_packed_bytes() -> None:
    model, _ = lora_model("nf4")  # sharded by FSDP2, as the run's line counts it
    expected = sum(p.numel() for p in M.build_model(TINY).parameters())
    expected += sum(p.numel() for name, p in model.named_parameters() if "lora_" in name)
    assert sum(p.numel() for p in model.parameters()) < expected  # packed bytes and absmax
    assert Q.logical_parameter_count(model) == expected
    fp8 = M.build_model(TINY).requires_grad_(False)
    assert Q.quantize_base(fp8, "fp8", torch.bfloat16).quantized > 0
    assert Q.logical_parameter_count(fp8) == sum(p.numel() for p in M.build_model(TINY).parameters())


@pytest.mark.parametrize(("precision", "per_weight", "from_gpus"), [("fp8", 1.0, 3), ("nf4", 0.5625, 4)])
def test_past_a_few_gpus_the_whole_quantized_base_says_a_sharded_bf16_one_would_be_smaller(
    precision: str, per_weight: float, from_gpus: int
) -> None:
    """A quantized base is whole on every GPU (buffers); a bf16 base is sharded over the FSDP group, so
    past a few GPUs it holds less per GPU, and the job says so at start: FLUX.1's 11.9 G weights, of
    which ~0.1 G (embedders, norms) stay bf16 and ~19 M are adapters in float32."""
    weights, unquantized, adapters = 11.9e9, 0.1e9, 19e6
    held = (weights - unquantized) * per_weight + unquantized * 2 + adapters * 4
    base = Q.QuantizedBase(precision, 500, [], int(weights * 2), int(held))
    said = [ranks for ranks in range(1, 9) if Q.whole_base_notice(base, int(weights + adapters), 2, ranks)]
    assert said == list(range(from_gpus, 9))
    line = Q.whole_base_notice(base, int(weights + adapters), 2, 8)
    assert line is not None and "\n" not in line and f"the {precision} base is held whole on each GPU" in line
    assert "over the 8 GPUs of a shard group (about 2,980 MB each)" in line
    bf16 = Q.QuantizedBase("bf16", 0, [], int(weights * 2), int(weights * 2))
    assert Q.whole_base_notice(bf16, int(weights), 2, 8) is None


@pytest.mark.parametrize("precision", ["fp8", "nf4"])
def test_quantized_lora_blocks_compile_whole_and_train_as_eager(
    monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """GPU systems compile every block (fullgraph: a graph break is an error): a LoRA block over a
    quantized base, its bytes read from buffers by our autograd functions, traces without a break and
    without a recompile per block: 3 double-stream blocks and 1 single-stream one make 3 graphs, as over
    a bf16 base (the first block's input needs no gradient, a frozen embedder's output; the later ones'
    do). Loss and adapter gradients equal the eager model's. Dynamo's 'eager' backend proves the tracing
    without inductor's minutes."""
    from torch._dynamo.utils import counters

    deeper = TINY.model_copy(update={"num_layers": 3, "num_single_layers": 1})
    eager, _ = lora_model(precision, args=deeper)
    compile_module = torch.nn.Module.compile
    monkeypatch.setattr(
        torch.nn.Module, "compile", lambda self, **kw: compile_module(self, backend="eager", **kw)
    )
    torch._dynamo.reset()
    graphs_before, breaks_before = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    model, _ = lora_model(precision, args=deeper, compile_blocks=True)
    loss, expected = loss_of(model), loss_of(eager)
    loss.backward()
    expected.backward()
    assert sum(counters["graph_break"].values()) == breaks_before, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] - graphs_before == 3  # 4 blocks: no recompile per block
    assert torch.equal(loss, expected)
    for (name, got), (_, want) in zip(model.named_parameters(), eager.named_parameters(), strict=True):
        if got.requires_grad:
            assert torch.equal(got.grad.full_tensor(), want.grad.full_tensor()), name
    torch._dynamo.reset()


def test_a_base_on_the_meta_device_is_refused_not_quantized_to_garbage() -> None:
    model = M.build_model(TINY, meta_init=True).requires_grad_(False)
    with pytest.raises(ValueError, match="needs real weights, not the meta device's"):
        Q.quantize_base(model, "nf4", torch.bfloat16)
