"""The hf workload's checkpoints (flux_cluster/hf/resume.py): everything a resume needs comes back (weights,
optimizer, scheduler, the fp16 GradScaler, the RNG, evaluations and the meter's totals), only LoRA's trained
weights are stored, and a damaged checkpoint or one of another model is one line."""

from pathlib import Path

import pytest
import torch

from flux_cluster.errors import FluxClusterError
from flux_cluster.hf.meter import HfTotals
from flux_cluster.hf.resume import HfProgress, restore, save
from flux_cluster.training.checkpoint import Checkpointer

CPU = torch.device("cpu")


def _bert(layers: int = 2) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40, hidden_size=8, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=8
    )
    return BertForSequenceClassification(config)


def _state(model: torch.nn.Module):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    return optimizer, scheduler, torch.amp.GradScaler("cpu", enabled=True)


def _step(model, optimizer, scheduler) -> None:
    batch = {"input_ids": torch.randint(0, 40, (2, 6)), "labels": torch.tensor([0, 1])}
    model(**batch).loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def _saved(folder: Path, model: torch.nn.Module, lora: bool = False) -> tuple[Checkpointer, HfProgress]:
    optimizer, scheduler, scaler = _state(model)
    _step(model, optimizer, scheduler)
    scaler.scale(torch.ones(()))  # the scale exists from the first scaled loss on
    scaler.update(new_scale=8.0)
    checkpoints = Checkpointer(folder, 2, 0, 1, frozen_base=lora)
    progress = HfProgress(3, [0.5], 0, HfTotals(12.5, 10.0, 2, 16, 256, 1.5))
    torch.manual_seed(123)
    save(checkpoints, progress, model, optimizer, scheduler, scaler, CPU)
    return checkpoints, progress


def test_a_resume_restores_weights_optimizer_scaler_rng_and_the_meter(tmp_path: Path) -> None:
    model = _bert()
    checkpoints, progress = _saved(tmp_path, model)
    expected_rand = torch.rand(3)  # what the RNG gives after the save

    fresh = _bert()
    optimizer, scheduler, scaler = _state(fresh)
    torch.manual_seed(999)
    path, skipped = checkpoints.choose()
    assert path is not None and path.name == "step_00000003" and skipped == []
    resumed = restore(checkpoints, path, fresh, optimizer, scheduler, scaler, CPU)
    assert resumed == HfProgress(3, [0.5], 1, progress.totals)  # attempt counted
    assert torch.equal(torch.rand(3), expected_rand)
    assert scaler.get_scale() == 8.0 and scheduler.last_epoch == 1
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    assert all(len(s) == 3 for s in optimizer.state.values()) and optimizer.state  # step, exp_avg, exp_avg_sq
    assert resumed.position(2) == (1, 1)


def test_lora_stores_only_the_trained_weights_and_resumes_them(tmp_path: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    from flux_cluster.hf.model import add_lora

    model = add_lora(_bert(), ["query", "value"], 4, 8)
    checkpoints, _ = _saved(tmp_path, model, lora=True)
    keys = list(FileSystemReader(tmp_path / "step_00000003").read_metadata().state_dict_metadata)
    weights = [k.removeprefix("model.") for k in keys if k.startswith("model.")]
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert weights and {w for w in weights} <= trained and any("lora_A" in w for w in weights)
    assert not any("word_embeddings" in k or "base_layer" in k for k in keys)

    fresh = add_lora(_bert(), ["query", "value"], 4, 8)
    optimizer, scheduler, scaler = _state(fresh)
    path, _ = checkpoints.choose()
    assert path is not None
    restore(checkpoints, path, fresh, optimizer, scheduler, scaler, CPU)
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_damaged_checkpoint_is_skipped_with_one_line(tmp_path: Path) -> None:
    checkpoints, _ = _saved(tmp_path, _bert())
    shard = next((tmp_path / "step_00000003").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-1] + b"x")
    path, skipped = checkpoints.choose()
    assert path is None and len(skipped) == 1
    assert "does not match its sha256" in skipped[0] and "\n" not in skipped[0]


def test_a_checkpoint_of_another_model_is_one_line(tmp_path: Path) -> None:
    checkpoints, _ = _saved(tmp_path, _bert(layers=2))
    other = _bert(layers=3)
    optimizer, scheduler, scaler = _state(other)
    path, _ = checkpoints.choose()
    assert path is not None
    with pytest.raises(FluxClusterError, match="not a checkpoint this run can resume") as error:
        restore(checkpoints, path, other, optimizer, scheduler, scaler, CPU)
    assert "\n" not in str(error.value) and str(path) in str(error.value)
