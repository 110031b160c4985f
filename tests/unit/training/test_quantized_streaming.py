"""A LoRA base read a tensor at a time (pretrained.load_streaming, which a full fine-tune reads with too):
the same model, adapters and bytes as the float32 load it replaces, in a fraction of its host memory."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_parallelize import one_rank

from flux_cluster.config.workload import load_workload
from flux_cluster.errors import FluxClusterError
from flux_cluster.training import model as M
from flux_cluster.training import pretrained as P
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
    model = P.pretrained_base(path, precision, "lora")
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
    before, after = Q.stored_state(old), Q.stored_state(new)  # with the quantized bytes
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert after[key].dtype == value.dtype and torch.equal(after[key], value), key
    adapters = [p for name, p in new.named_parameters() if "lora_" in name]
    assert adapters and all(p.dtype == torch.float32 and p.requires_grad for p in adapters)
    assert new.training is old.training
    assert torch.equal(loss_of(new), loss_of(old))


def test_a_streamed_pre_quantized_checkpoint_keeps_its_stored_bytes(plain: Path, tmp_path: Path) -> None:
    written = P.save_quantized(plain, tmp_path / "nf4", "nf4")
    model = P.pretrained_base(written, "nf4", "lora")
    assert model is not None
    # not dequantized: the linear weights wait as their stored bytes until quantize_base
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    waiting = [getattr(m.weight, Q.AS_READ) for m in linears if m.in_features % Q.NF4_BLOCK == 0]
    assert waiting and all(read[1][0].dtype == torch.uint8 for read in waiting)
    old = old_way(plain, "nf4")
    torch.manual_seed(1)
    M.add_lora(model, 4, 4.0, TARGETS)
    Q.quantize_base(model, "nf4", torch.bfloat16)
    state = Q.stored_state(model)
    assert all(torch.equal(state[k], v) for k, v in Q.stored_state(old).items())


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
    new = peak_growth(lambda: P.pretrained_base(tmp_path, "nf4", "lora"))
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

    model = P.pretrained_base(path, "nf4", "lora")
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


def test_a_stopped_nf4_lora_run_resumes_to_the_uninterrupted_losses(one_rank: None, tmp_path: Path) -> None:
    from flux_cluster.training.checkpoint import Checkpointer

    # one block of each kind (the CPU's nf4 dequantizing is the cost); stopped after a step, resumed for one:
    # the losses, and the adapters after the resumed optimizer step (taken from the restored adamw state)
    plain = tmp_path / "plain"
    torch.manual_seed(0)
    M.build_model(TINY.model_copy(update={"num_layers": 1, "num_single_layers": 1})).to(
        torch.bfloat16
    ).save_pretrained(plain)
    whole, whole_optimizer = trainer(plain, 1)
    uninterrupted = steps(whole, whole_optimizer, 2)
    model, optimizer = trainer(plain, 1)
    first = steps(model, optimizer, 1)
    checkpoints = Checkpointer(tmp_path / "runs", keep=1, rank=0, world_size=1, frozen_base=True)
    saved = checkpoints.save(1, model, optimizer, {}, {})
    # adapters and their optimizer state only: the quantized base is made again from the pretrained one
    import torch.distributed.checkpoint as dcp

    stored = [
        k for k in dcp.FileSystemReader(saved).read_metadata().state_dict_metadata if k.startswith("model.")
    ]
    assert stored and all("lora_" in key for key in stored)
    model, optimizer = trainer(plain, 2)  # other adapters: the checkpoint must bring them back
    checkpoints.load(saved, model, optimizer)
    assert first + steps(model, optimizer, 1) == uninterrupted
    adapters = {name: p.to_local() for name, p in whole.named_parameters() if p.requires_grad}
    resumed = {name: p.to_local() for name, p in model.named_parameters() if p.requires_grad}
    assert adapters and all(torch.equal(resumed[name], value) for name, value in adapters.items())


# ---- what a checkpoint folder may be: a Hugging Face snapshot, or damaged


def snapshot_of(folder: Path, root: Path) -> Path:
    """``folder`` as ``huggingface-cli download`` leaves it in the cache: every file a symlink into blobs/."""
    (root / "blobs").mkdir(parents=True)
    (root / "snapshots" / "abc").mkdir(parents=True)
    for number, file in enumerate(sorted(folder.iterdir())):
        blob = root / "blobs" / f"blob{number}"
        blob.write_bytes(file.read_bytes())
        (root / "snapshots" / "abc" / file.name).symlink_to(Path("../../blobs") / blob.name)
    return root / "snapshots" / "abc"


def streamed_state(path: Path) -> dict[str, torch.Tensor]:
    """The bf16 base as load_streaming reads it and quantize_base stores it."""
    model = P.pretrained_base(path, "bf16", "lora")
    assert model is not None
    Q.quantize_base(model.requires_grad_(False), "bf16", torch.bfloat16)  # frozen, as add_lora leaves it
    return model.state_dict()


def test_a_sharded_hugging_face_snapshot_loads_as_its_plain_folder(plain: Path, tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    M.load_pretrained(plain).to(torch.bfloat16).save_pretrained(sharded, max_shard_size="1MB")
    assert (sharded / "diffusion_pytorch_model.safetensors.index.json").is_file()
    snapshot = snapshot_of(sharded, tmp_path / "hub")
    assert all(file.is_symlink() for file in snapshot.iterdir())
    expected, loaded = streamed_state(plain), streamed_state(snapshot)
    assert expected.keys() == loaded.keys()
    assert all(torch.equal(loaded[key], value) for key, value in expected.items())


def folder_with(plain: Path, tmp_path: Path, state: dict[str, torch.Tensor] | None = None) -> Path:
    """A transformer folder with plain's config.json and ``state`` as its weights (plain's when None)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes((plain / "config.json").read_bytes())
    if state is None:
        state = load_file(plain / "diffusion_pytorch_model.safetensors")
    save_file(state, folder / "diffusion_pytorch_model.safetensors")
    return folder


def one_line_error(path: Path, precision: str = "bf16") -> str:
    with pytest.raises(FluxClusterError) as caught:
        P.load_streaming(path, precision)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 600
    return message


def index_folder(plain: Path, tmp_path: Path, weight_map: object) -> Path:
    import json

    folder = tmp_path / "indexed"
    folder.mkdir()
    (folder / "config.json").write_bytes((plain / "config.json").read_bytes())
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"weight_map": weight_map})
    )
    return folder


@pytest.mark.parametrize("shard", ["", "..", "../x.safetensors", "sub/x.safetensors"])
def test_an_index_naming_files_outside_its_folder_is_refused(plain: Path, tmp_path: Path, shard: str) -> None:
    folder = index_folder(plain, tmp_path, {"x_embedder.weight": shard})
    assert "weight_map: expected" in one_line_error(folder)


def test_an_empty_weight_map_is_one_line_naming_the_index(plain: Path, tmp_path: Path) -> None:
    folder = index_folder(plain, tmp_path, {})
    message = one_line_error(folder)
    assert str(folder / "diffusion_pytorch_model.safetensors.index.json") in message and "empty" in message


def test_a_shard_that_is_a_fifo_is_refused_not_waited_on(plain: Path, tmp_path: Path) -> None:
    import os

    folder = index_folder(plain, tmp_path, {"x_embedder.weight": "a.safetensors"})
    os.mkfifo(folder / "a.safetensors")
    assert "not a regular file" in one_line_error(folder)


@pytest.mark.parametrize("how", ["wrong shape", "1-D"])
def test_a_wrong_shaped_weight_is_one_line_naming_file_key_and_shapes(
    plain: Path, tmp_path: Path, how: str
) -> None:
    from safetensors.torch import load_file

    state = load_file(plain / "diffusion_pytorch_model.safetensors")
    key = "transformer_blocks.0.attn.to_q.weight"
    rows, cols = state[key].shape
    state[key] = torch.zeros((rows, cols + 1) if how == "wrong shape" else (rows,), dtype=torch.bfloat16)
    folder = folder_with(plain, tmp_path, state)
    found = [rows, cols + 1] if how == "wrong shape" else [rows]
    message = one_line_error(folder)
    assert str(folder / "diffusion_pytorch_model.safetensors") in message and key in message
    assert f"shape {found}, expected {[rows, cols]}" in message


def test_extra_tensors_are_ignored_with_a_notice_and_missing_ones_refused(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    state = load_file(plain / "diffusion_pytorch_model.safetensors")
    extra = folder_with(plain, tmp_path / "extra", state | {"extra.weight": torch.zeros(2)})
    assert P.load_streaming(extra, "bf16") is not None  # as from_pretrained loads it (with a warning)
    notice = capsys.readouterr().out.strip()
    assert notice.count("\n") == 0 and "1 tensors" in notice and "extra.weight" in notice
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)  # in this module's gloo group
    assert P.load_streaming(extra, "bf16") is not None  # every rank reads the file; rank 0 alone says so
    assert capsys.readouterr().out == ""
    del state["x_embedder.weight"], state["x_embedder.bias"]
    missing = folder_with(plain, tmp_path / "missing", state)
    message = one_line_error(missing)
    assert "2 tensors" in message and "missing" in message and "x_embedder.bias" in message


def header_file(folder: Path, header: bytes, data: bytes, length: int | None = None) -> None:
    prefix = (len(header) if length is None else length).to_bytes(8, "little")
    (folder / "diffusion_pytorch_model.safetensors").write_bytes(prefix + header + data)


def entry(offsets: object, shape: object = (2,), dtype: str = "F32") -> dict[str, object]:
    return {
        "dtype": dtype,
        "shape": list(shape) if isinstance(shape, tuple) else shape,
        "data_offsets": offsets,
    }


DAMAGED = {  # how: (header, data bytes, expected in the message)
    "string offsets": ({"a": entry(["0", "8"])}, 8, "header entry 'a'"),
    "float offsets": ({"a": entry([0.0, 8.0])}, 8, "header entry 'a'"),
    "bool offsets": ({"a": entry([False, 8])}, 8, "header entry 'a'"),
    "negative offsets": ({"a": entry([-8, 0])}, 8, "header entry 'a'"),
    "string shape": ({"a": entry([0, 8], ["2"])}, 8, "header entry 'a'"),
    "unknown dtype": ({"a": entry([0, 8], dtype="Q9")}, 8, "header entry 'a'"),
    "entry not an object": ({"a": [0, 8]}, 8, "header entry 'a'"),
    "control characters": ({"a\x1b[2J": entry(["0", "8"])}, 8, "header entry 'a\\x1b[2J'"),
    "size mismatch": ({"a": entry([0, 4])}, 4, "4 bytes for shape [2]"),
    "overlapping": ({"a": entry([0, 8]), "b": entry([4, 12])}, 12, "overlap or leave a gap"),
    "gap": ({"a": entry([0, 8]), "b": entry([12, 20])}, 20, "overlap or leave a gap"),
    "past the end": ({"a": entry([0, 8])}, 4, "truncated or padded"),
    "padded": ({"a": entry([0, 8])}, 12, "truncated or padded"),
    "not an object": ([1, 2], 0, "not a JSON object"),
}


@pytest.mark.parametrize("how", [*DAMAGED, "deep nesting", "huge header length", "shorter than 8 bytes"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])  # a LoRA base, a full fine-tune: one reader
def test_a_damaged_safetensors_header_is_one_line_naming_the_file(
    plain: Path, tmp_path: Path, how: str, precision: str
) -> None:
    import json

    folder = folder_with(plain, tmp_path)
    file = folder / "diffusion_pytorch_model.safetensors"
    if how in DAMAGED:
        header, size, expected = DAMAGED[how]
        header_file(folder, json.dumps(header).encode(), bytes(size))
    elif how == "deep nesting":
        header_file(folder, b"[" * 100_000 + b"]" * 100_000, b"")
        expected = "nested too deeply"
    elif how == "huge header length":
        header_file(folder, b"{}", b"", length=1 << 40)
        expected = "header length"
    else:
        file.write_bytes(b"\x02\x00")
        expected = "header length"
    message = one_line_error(folder, precision)
    assert str(file) in message and expected in message, message
