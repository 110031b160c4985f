"""train.optimizer under FSDP2 and train.lora_init: every optimizer steps sharded (DTensor) parameters on
2 gloo ranks, keeps replicated values equal, and resumes bit for bit from a checkpoint; LoRA adapters
start from a saved file, and a file that does not fit the config is one line."""

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from flux_cluster.config.workload import load_workload
from flux_cluster.errors import FluxClusterError
from flux_cluster.training import model as M
from flux_cluster.training.optimizers import build_optimizer

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
    assert (
        "safetensors header length" if content else "no LoRA weights in it"
    ) in message  # the checked reader


def test_a_missing_optimizer_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prodigyopt", None)  # what an environment without it imports
    with pytest.raises(
        FluxClusterError, match=r"^train.optimizer 'prodigy' needs the Python package prodigyopt"
    ):
        build_optimizer("prodigy", [torch.nn.Parameter(torch.zeros(2))], 1.0, torch.device("cpu"))
