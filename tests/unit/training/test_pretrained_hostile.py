"""A pretrained FLUX folder, a LoRA file and a pre-quantized checkpoint we do not control, crafted: each
gives one line naming the file and the key, in bounded time and memory, on every path that reads them
(full fine-tuning and LoRA through the one streaming reader, diffusers' own load, evaluate)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flux_cluster.config.transformer_config import (
    MAX_PARAMETERS,
    estimated_parameters,
    read_transformer_config,
)
from flux_cluster.config.workload import load_workload
from flux_cluster.errors import FluxClusterError, allocation_failed
from flux_cluster.safe_text import printable
from flux_cluster.training import model as M
from flux_cluster.training import pretrained as P

TINY = load_workload("flux1")[0].models["tiny"]
WEIGHTS = "diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny diffusers transformer in bf16, as FLUX.1 is published (one block of each kind)."""
    folder = tmp_path_factory.mktemp("plain")
    torch.manual_seed(0)
    M.build_model(TINY.model_copy(update={"num_layers": 1, "num_single_layers": 1})).to(
        torch.bfloat16
    ).save_pretrained(folder)
    return folder


def one_line(call, *args: object) -> str:  # type: ignore[no-untyped-def]
    """The FluxClusterError call(*args) raises: one line, control characters spelled out."""
    with pytest.raises(FluxClusterError) as caught:
        call(*args)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 700 and printable(message) == message, message
    return message


def with_config(plain: Path, folder: Path, **changes: object) -> Path:
    """plain's weights with its config.json changed."""
    folder.mkdir(parents=True)
    (folder / WEIGHTS).symlink_to(plain / WEIGHTS)
    config = json.loads((plain / "config.json").read_text()) | changes
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# ---- config.json: shapes within bounds before anything is built

CONFIGS = {  # changes: what the line says
    "a million blocks": (
        {"num_layers": 1_000_000},
        "num_layers 1000000: expected a whole number from 0 to 1,024",
    ),
    "single blocks": ({"num_single_layers": 2000}, "num_single_layers 2000"),
    "negative": ({"num_layers": -1}, "num_layers -1"),
    "float": ({"num_layers": 1.5}, "num_layers 1.5"),
    "text": ({"num_attention_heads": "24"}, "num_attention_heads '24'"),
    "bool": ({"in_channels": True}, "in_channels True"),
    "huge head": ({"attention_head_dim": 2**40}, "attention_head_dim 1099511627776"),
    "width": (
        {"attention_head_dim": 1024, "num_attention_heads": 1024, "axes_dims_rope": [16, 504, 504]},
        "attention_head_dim x num_attention_heads is 1,048,576: expected at most 65,536",
    ),
    "T5 width": ({"joint_attention_dim": 2**31}, "joint_attention_dim 2147483648"),
    "pooled": ({"pooled_projection_dim": 0}, "pooled_projection_dim 0"),
    "out channels": ({"out_channels": 10**6}, "out_channels 1000000"),
    "rope sum": ({"axes_dims_rope": [2, 2, 2]}, "axes_dims_rope [2, 2, 2]: expected three even sizes"),
    "rope odd": ({"axes_dims_rope": [3, 7, 6]}, "axes_dims_rope [3, 7, 6]"),
    "rope text": ({"axes_dims_rope": "big"}, "axes_dims_rope 'big'"),
    "guidance": ({"guidance_embeds": "yes"}, "guidance_embeds 'yes': expected true or false"),
    "control characters": ({"num_layers": "\x1b[2J"}, "num_layers '\\x1b[2J'"),
    "too many parameters": (
        {
            "num_layers": 1024,
            "attention_head_dim": 128,
            "num_attention_heads": 64,
            "axes_dims_rope": [16, 56, 56],
        },
        "B parameters; expected at most 100B (FLUX.1: 11.9B)",
    ),
}


@pytest.mark.parametrize("case", CONFIGS)
def test_a_config_out_of_bounds_is_one_line_naming_the_file_and_key(
    plain: Path, tmp_path: Path, case: str
) -> None:
    changes, expected = CONFIGS[case]
    folder = with_config(plain, tmp_path / "model", **changes)
    message = one_line(read_transformer_config, folder)
    assert message.startswith(str(folder / "config.json")) and expected in message, message


@pytest.mark.parametrize(
    "text", ["[" * 100_000 + "]" * 100_000, '{"num_layers": ' + "9" * 5000 + "}", "[1, 2]", "{not json"]
)
def test_a_config_that_is_no_json_object_is_one_line(plain: Path, tmp_path: Path, text: str) -> None:
    folder = with_config(plain, tmp_path / "model")
    (folder / "config.json").write_text(text)
    assert str(folder / "config.json") in one_line(read_transformer_config, folder)


def test_a_config_that_is_a_fifo_or_too_big_is_refused_without_reading_it(
    plain: Path, tmp_path: Path
) -> None:
    import os

    fifo = with_config(plain, tmp_path / "fifo")
    (fifo / "config.json").unlink()
    os.mkfifo(fifo / "config.json")
    assert "not a regular file" in one_line(read_transformer_config, fifo)
    big = with_config(plain, tmp_path / "big")
    (big / "config.json").write_text('{"x": "' + "a" * (2 << 20) + '"}')
    assert "over 1 MiB" in one_line(read_transformer_config, big)


def test_every_reader_of_a_pretrained_folder_checks_its_config_first(
    plain: Path, tmp_path: Path, tiny_pipeline: Path
) -> None:
    """Full fine-tuning, LoRA, diffusers' own load and evaluate's pipeline: no block of 2000 is built."""
    import shutil

    from flux_cluster.evaluate.run import _load_pipeline

    folder = with_config(plain, tmp_path / "model", num_layers=2000)
    for mode in ("finetune", "lora"):
        assert "num_layers 2000" in one_line(P.pretrained_base, folder, "bf16", mode)
    assert "num_layers 2000" in one_line(M.load_pretrained, folder)
    pipeline = tmp_path / "pipeline"
    shutil.copytree(tiny_pipeline, pipeline, symlinks=True)
    config = pipeline / "transformer" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"num_layers": 2000}))
    message = one_line(_load_pipeline, pipeline, torch.device("cpu"), torch.float32)
    assert str(config) in message and "num_layers 2000" in message


def test_the_parameter_estimate_is_within_a_percent_of_the_model() -> None:
    """The bound counts what the config builds (FLUX.1: 11.9B), so it refuses only absurd configs."""
    from flux_cluster.config.transformer_config import _WHOLE
    from flux_cluster.training.memory import parameter_counts

    for args in load_workload("flux1")[0].models.values():
        shape = {key: args.model_dump().get(key, flux) for key, (_, _, flux) in _WHOLE.items()}
        built = parameter_counts(args).total(args)
        assert abs(estimated_parameters(shape, args.hidden) - built) < 0.01 * built
    assert MAX_PARAMETERS > 8 * 11.9e9


# ---- the weights: one reader for full fine-tuning and LoRA


def test_full_fine_tuning_reads_the_weights_diffusers_loads_trainable(plain: Path) -> None:
    streamed = P.pretrained_base(plain, "bf16", "finetune")
    assert streamed is not None
    loaded = M.load_pretrained(plain)
    expected, got = loaded.state_dict(), streamed.state_dict()
    assert expected.keys() == got.keys()
    assert all(got[k].dtype == torch.float32 and torch.equal(got[k], v) for k, v in expected.items())
    assert all(p.requires_grad for p in streamed.parameters())


def weights_with(plain: Path, folder: Path, state: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes((plain / "config.json").read_bytes())
    save_file(state, folder / WEIGHTS)
    return folder


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.bool, torch.uint8])
@pytest.mark.parametrize("mode", ["finetune", "lora"])
def test_integer_weights_are_refused_naming_the_tensor(
    plain: Path, tmp_path: Path, dtype: torch.dtype, mode: str
) -> None:
    from safetensors.torch import load_file

    state = load_file(plain / WEIGHTS)
    key = "transformer_blocks.0.attn.to_q.weight"
    state[key] = state[key].to(dtype)
    folder = weights_with(plain, tmp_path / "model", state)
    message = one_line(P.pretrained_base, folder, "nf4" if mode == "lora" else "bf16", mode)
    assert str(folder / WEIGHTS) in message and key in message and "expected floating point" in message


def sparse_safetensors(file: Path, entries: list[tuple[str, str, list[int], bytes | None]]) -> None:
    """A safetensors file whose tensors of no bytes (None) are holes: a terabyte costs no disk."""
    header, at = {}, 0
    for name, dtype, shape, _ in entries:
        size = math.prod(shape) * {"F32": 4, "BF16": 2}[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + size]}
        at += size
    text = json.dumps(header).encode()
    with file.open("wb") as handle:
        handle.write(len(text).to_bytes(8, "little") + text)
        for _, _, _, data in entries:
            if data is not None:
                handle.write(data)
        handle.truncate(8 + len(text) + at)


def test_the_header_is_checked_against_the_config_before_a_byte_is_allocated(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A terabyte tensor the model lacks is skipped unread; one it has with a terabyte shape is refused."""
    from safetensors.torch import load_file

    real = [
        (k, "BF16", list(v.shape), v.view(torch.uint8).numpy().tobytes())
        for k, v in load_file(plain / WEIGHTS).items()
    ]
    folder = weights_with(plain, tmp_path / "extra", {})
    sparse_safetensors(folder / WEIGHTS, [*real, ("extra.weight", "F32", [1 << 38], None)])
    assert P.pretrained_base(folder, "bf16", "finetune") is not None  # as diffusers: a notice
    assert "extra.weight" in capsys.readouterr().out
    wide = [(k, d, [1 << 19, 1 << 19] if k == "x_embedder.weight" else s, b) for k, d, s, b in real]
    wide = [(k, d, s, None if k == "x_embedder.weight" else b) for k, d, s, b in wide]
    folder = weights_with(plain, tmp_path / "wide", {})
    sparse_safetensors(folder / WEIGHTS, wide)
    message = one_line(P.pretrained_base, folder, "bf16", "finetune")
    assert f"x_embedder.weight: shape {[1 << 19, 1 << 19]}, expected" in message


def test_an_allocation_failure_is_said_as_one(plain: Path, tmp_path: Path) -> None:
    """A 1 GiB weight of a legitimate shape under an address-space limit: out of memory, not a bad file."""
    config = {"num_layers": 0, "num_single_layers": 0, "joint_attention_dim": 4096}
    config |= {"num_attention_heads": 512, "attention_head_dim": 128, "axes_dims_rope": [16, 56, 56]}
    folder = with_config(plain, tmp_path / "big", **config)
    (folder / WEIGHTS).unlink()
    sparse_safetensors(folder / WEIGHTS, [("context_embedder.weight", "F32", [65536, 4096], None)])
    # in a fresh process: this one's freed memory (earlier tests) can serve the weight within any limit
    code = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from diffusers import FluxTransformer2DModel\n"  # its lazy imports map libraries: before the limit
        "from flux_cluster.errors import FluxClusterError\n"
        "from flux_cluster.training import pretrained as P\n"
        "status = Path('/proc/self/status').read_text()\n"
        "in_use = int(next(l.split()[1] for l in status.splitlines() if l.startswith('VmSize:'))) * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (in_use + (512 << 20), resource.RLIM_INFINITY))\n"
        "try:\n"
        "    P.pretrained_base(Path(sys.argv[1]), 'bf16', 'finetune')\n"
        "except FluxClusterError as exc:\n"
        "    print(exc)\n"
    )
    command = [sys.executable, "-c", code, str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    message = done.stdout.strip()
    assert done.returncode == 0 and "\n" not in message and printable(message) == message, done.stderr[-2000:]
    assert str(folder / WEIGHTS) in message and "out of host memory" in message
    assert "shape" not in message.split("(")[0]
    with pytest.raises(RuntimeError) as caught:
        torch.empty(1 << 50)
    assert allocation_failed(caught.value) and not allocation_failed(RuntimeError("size mismatch"))


# ---- LoRA files: train.lora_init and evaluate's adapters


@pytest.fixture(scope="module")
def adapted(plain: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """A model with adapters, and its LoRA file as a run saves it."""
    model = M.load_pretrained(plain)
    M.add_lora(model, 4, 4.0, ["to_q", "to_k", "to_v", "to_out.0"])
    folder = tmp_path_factory.mktemp("lora")
    return model, M.save_lora(M.lora_state_dict(model), M.lora_metadata(model), folder)


def craft_lora(lora: Path, file: Path, how: str) -> str:
    """A copy of lora damaged as ``how`` says; returns the tensor it names."""
    from safetensors.torch import load_file, save_file

    state = load_file(lora)
    key = sorted(state)[0]
    if how == "int32":
        state[key] = state[key].to(torch.int32)
    elif how == "bool":
        state[key] = state[key] > 0
    elif how == "all NaN":
        state = {k: torch.full_like(v, float("nan")) for k, v in state.items()}
    elif how == "one inf":
        state[key] = state[key].clone()
        state[key].view(-1)[0] = float("inf")
    elif how == "escape in a name":  # a layer the model lacks, named with a terminal escape
        for name in [k for k in state if k.startswith(key.rpartition(".lora_")[0])]:
            state[name.replace(".attn.", ".at\x1b[2Jtn.")] = state.pop(name)
        key = "at\\x1b[2Jtn"
    save_file(state, file)
    return key


LORA_CASES = {
    "int32": "int32 values; expected floating point",
    "bool": "bool values; expected floating point",
    "all NaN": "NaN or infinite values",
    "one inf": "NaN or infinite values",
    "escape in a name": "does not fit the model",
}


@pytest.mark.parametrize("how", LORA_CASES)
def test_a_crafted_lora_init_is_one_line_naming_the_file_and_tensor(
    adapted: tuple[torch.nn.Module, Path], tmp_path: Path, how: str
) -> None:
    model, lora = adapted
    file = tmp_path / "init.safetensors"
    key = craft_lora(lora, file, how)
    message = one_line(M.load_lora_init, model, file, 4, ["to_q", "to_k", "to_v", "to_out.0"])
    assert message.startswith(f"train.lora_init: {file}") and LORA_CASES[how] in message, message
    assert key in message


@pytest.mark.parametrize("how", ["int32", "all NaN", "escape in a name"])
def test_evaluate_checks_a_lora_as_lora_init_does(
    adapted: tuple[torch.nn.Module, Path], tmp_path: Path, how: str
) -> None:
    from flux_cluster.evaluate.run import _check_lora_fits

    model, lora = adapted
    file = tmp_path / "eval.safetensors"
    craft_lora(lora, file, how)
    message = one_line(_check_lora_fits, model, file, tmp_path)
    assert message.startswith(str(file)), message
    if how == "escape in a name":  # no such layer: its name spelled out
        assert "at\\x1b[2Jtn" in message and "no such layer" in message


def test_a_damaged_lora_header_is_one_line(adapted: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    model, lora = adapted
    file = tmp_path / "short.safetensors"
    file.write_bytes(lora.read_bytes()[:100])
    message = one_line(M.load_lora_init, model, file, 4, ["to_q"])
    assert str(file) in message and "header" in message


def test_evaluate_checks_the_weights_diffusers_reads_with_the_same_reader(
    tiny_pipeline: Path, tmp_path: Path
) -> None:
    """A damaged pipeline transformer and an integer fine-tuned transformer: one line naming the file and
    tensor before diffusers reads them (it took the integers, casting them)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from flux_cluster.evaluate.run import _apply_weights, _load_pipeline

    cpu = torch.device("cpu")
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_pipeline, damaged)
    file = damaged / "transformer" / WEIGHTS
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    message = one_line(_load_pipeline, damaged, cpu, torch.float32)
    assert message.startswith(str(file)) and "truncated" in message
    tuned = tmp_path / "tuned"
    shutil.copytree(tiny_pipeline / "transformer", tuned)
    state = load_file(tuned / WEIGHTS)
    state["x_embedder.weight"] = state["x_embedder.weight"].to(torch.int32)
    save_file(state, tuned / WEIGHTS)
    pipe = _load_pipeline(tiny_pipeline, cpu, torch.float32)
    message = one_line(_apply_weights, pipe, tuned, "transformer", tiny_pipeline, cpu, torch.float32)
    assert message.startswith(str(tuned / WEIGHTS)) and "x_embedder.weight: int32 values" in message
