"""The hf workload's checkpoints (flux_cluster/hf/resume.py): everything a resume needs comes back (weights,
optimizer, scheduler, the fp16 GradScaler, the RNG, evaluations and the meter's totals), only LoRA's trained
weights are stored, and a damaged checkpoint, one of another model or a meter that is not numbers is one
line; the time attempts spent past the checkpoint counts as lost; dp's every-GPU RNG states come back."""

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from flux_cluster.errors import FluxClusterError
from flux_cluster.hf.resume import HfProgress, restore, save
from flux_cluster.training.checkpoint import STATE_FILE, Checkpointer
from flux_cluster.training.metrics import RunClock, Totals

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


def _saved(
    folder: Path, model: torch.nn.Module, lora: bool = False, device: torch.device = CPU
) -> tuple[Checkpointer, HfProgress]:
    optimizer, scheduler, scaler = _state(model)
    _step(model, optimizer, scheduler)
    scaler.scale(torch.ones(()))  # the scale exists from the first scaled loss on
    scaler.update(new_scale=8.0)
    checkpoints = Checkpointer(folder, 2, 0, 1, frozen_base=lora)
    progress = HfProgress(3, [0.5], 0, Totals(RunClock(12.5, 10.0, 2, 0.0, 1.5), 16, 256))
    torch.manual_seed(123)
    save(checkpoints, progress, model, optimizer, scheduler, scaler, device)
    return checkpoints, progress


def _restore(folder: Path, model: torch.nn.Module, metrics: Path | None = None, device=CPU) -> HfProgress:
    checkpoints = Checkpointer(folder, 2, 0, 1)
    optimizer, scheduler, scaler = _state(model)
    path = checkpoints.latest()
    assert path is not None
    metrics = metrics or folder / "no-metrics.jsonl"
    return restore(checkpoints, path, model, optimizer, scheduler, scaler, device, metrics, True)


def test_a_resume_restores_weights_optimizer_scaler_rng_and_the_meter(tmp_path: Path) -> None:
    model = _bert()
    checkpoints, progress = _saved(tmp_path, model)
    expected_rand = torch.rand(3)  # what the RNG gives after the save

    fresh = _bert()
    optimizer, scheduler, scaler = _state(fresh)
    torch.manual_seed(999)
    path, skipped = checkpoints.choose()
    assert path is not None and path.name == "step_00000003" and skipped == []
    resumed = restore(checkpoints, path, fresh, optimizer, scheduler, scaler, CPU, tmp_path / "none", True)
    assert resumed == HfProgress(3, [0.5], 1, progress.totals)  # attempt counted; no metrics: nothing lost
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
    restore(checkpoints, path, fresh, optimizer, scheduler, scaler, CPU, tmp_path / "none", True)
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
        restore(checkpoints, path, other, optimizer, scheduler, scaler, CPU, tmp_path / "none", True)
    assert "\n" not in str(error.value) and str(path) in str(error.value)


def test_time_an_attempt_spent_past_the_checkpoint_counts_as_lost(tmp_path: Path) -> None:
    _saved(tmp_path / "c", _bert())
    metrics = tmp_path / "metrics_0.jsonl"  # the killed attempt's last step line, on the run's timeline
    step = {"step": 5, "loss": 0.4, "train_seconds": 20.0}
    metrics.write_text(json.dumps(step) + "\n" + json.dumps({"summary": {"train_seconds": 99.0}}) + "\n")
    clock = _restore(tmp_path / "c", _bert(), metrics).totals.clock
    assert (clock.train_seconds, clock.lost_seconds) == (20.0, 7.5)  # 12.5 s at the checkpoint
    assert (clock.timed_seconds, clock.timed_steps) == (10.0, 2)  # not throughput


@pytest.fixture(scope="module")
def saved_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("saved")
    _saved(folder, _bert())
    return folder


@pytest.mark.parametrize(
    ("meter", "expected"),
    [
        ({"timed_samples": 16}, "expected an object with the keys clock, timed_samples, timed_tokens"),
        ("x", "meter: got 'x', expected an object"),
        ({"clock.train_seconds": float("nan")}, "meter.clock.train_seconds: got nan, expected a finite"),
        ({"clock.lost_seconds": -1.0}, "meter.clock.lost_seconds: got -1.0, expected a finite number >= 0"),
        ({"timed_tokens": 2.5}, "meter.timed_tokens: got 2.5, expected a whole number >= 0"),
        ({"clock.timed_steps": "2"}, "meter.clock.timed_steps: got '2', expected a whole number >= 0"),
        ({"clock.peak_memory_gb": 10**400}, "meter.clock.peak_memory_gb: got 1000"),
        ({"clock.spare": 1}, "meter.clock: got ['lost_seconds', 'peak_memory_gb', 'spare',"),
    ],
)
def test_a_meter_that_is_not_numbers_is_one_line_naming_the_key(
    saved_once: Path, tmp_path: Path, meter: Any, expected: str
) -> None:
    shutil.copytree(saved_once, tmp_path, dirs_exist_ok=True)
    state = tmp_path / "step_00000003" / STATE_FILE
    shared = json.loads(state.read_text())
    if isinstance(meter, dict) and "timed_samples" not in meter:  # one key of the saved meter changed
        ((key, value),) = meter.items()
        where, _, name = key.rpartition(".")
        (shared["meter"][where] if where else shared["meter"])[name] = value
    else:
        shared["meter"] = meter
    state.write_text(json.dumps(shared))
    with pytest.raises(FluxClusterError) as error:
        _restore(tmp_path, _bert())
    message = str(error.value)
    assert message.startswith(f"{state}: meter") and expected in message and "\n" not in message


def test_every_gpus_rng_state_is_saved_and_restored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dp: one process drives every GPU, each replica's dropout on its own generator. CUDA's generators
    stand in here (this test runs without a GPU); on CPU no CUDA state is saved or touched."""
    states = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3, 4], dtype=torch.uint8)]
    restored: list[Any] = []
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: states)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    _saved(tmp_path / "cpu", _bert())
    _restore(tmp_path / "cpu", _bert())
    assert restored == []  # CPU: CUDA's RNG is left alone
    cuda = torch.device("cuda", 0)
    _saved(tmp_path / "gpu", _bert(), device=cuda)
    _restore(tmp_path / "gpu", _bert(), device=cuda)
    (back,) = restored
    assert len(back) == 2 and all(torch.equal(a, b) for a, b in zip(back, states, strict=True))
