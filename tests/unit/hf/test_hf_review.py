"""The hf workload's review fixes: FLOPs counted on the distributed model, dp's replicas under the
run's autocast dtype, shuffled cuts and hold-outs, labels named alike over the splits, the model padding
with its tokenizer's pad token, and one line for mismatched weights, non-linear LoRA targets, a corrupt
image met later and dp's GPUs unlike system.gpus_per_node."""

import json
import re
import threading
from pathlib import Path

import pytest
import torch

from flux_cluster.config.hf import HfConfig
from flux_cluster.errors import FluxClusterError
from flux_cluster.hf.data import load_data
from flux_cluster.runtime.dist import DistInfo

CPU = torch.device("cpu")


def _bert(num_labels: int = 2):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40,
        hidden_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=8,
        num_labels=num_labels,
    )
    return BertForSequenceClassification(config)


def _tokenizer():
    from transformers import BertTokenizerFast

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghij"]
    return BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)})


def test_flops_counted_on_the_distributed_model_without_leftovers(one_rank: DistInfo) -> None:
    from torch.distributed.fsdp import FSDPModule

    from flux_cluster.hf.data import synthetic
    from flux_cluster.hf.train import Batching, distribute_and_count

    split = synthetic("text-classification", HfConfig(seq_len=8), _bert().config, 4, 0)
    counts = {}
    for parallel in ("ddp", "fsdp"):  # dp on a CPU takes ddp's path (no GPUs to wrap)
        model, counts[parallel] = distribute_and_count(
            _bert(), split, Batching.of(4, 1, 1), parallel, one_rank, "fp32"
        )
        assert all(p.grad is None for p in model.parameters()), parallel
        assert isinstance(model, FSDPModule) == (parallel == "fsdp")
    assert counts["ddp"] > 0 and counts["ddp"] == counts["fsdp"]


def test_dp_replicas_enter_the_runs_autocast_dtype_in_their_own_thread() -> None:
    from flux_cluster.hf.parallel import Autocast, unwrapped

    seen = []

    class Probe(torch.nn.Module):
        def forward(self) -> None:
            seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))

    wrapped = Autocast(Probe(), "cpu", torch.bfloat16)
    thread = threading.Thread(target=wrapped)  # as DataParallel's parallel_apply runs a replica
    bare = threading.Thread(target=Probe())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        thread.start(), thread.join()
        bare.start(), bare.join()
    assert seen[0] == (True, torch.bfloat16)
    assert not seen[1][0]  # the issue: a worker thread does not inherit the caller's autocast
    assert isinstance(unwrapped(torch.nn.DataParallel(wrapped, device_ids=[])), type(wrapped.module))


def _jsonl(path: Path, labels: list) -> None:
    path.write_text("".join(json.dumps({"text": "ab cd", "label": v}) + "\n" for v in labels))


def test_label_sorted_data_is_shuffled_before_the_cut_and_the_hold_out(tmp_path: Path) -> None:
    _jsonl(tmp_path / "data.jsonl", [0] * 10 + [1] * 10 + [2] * 10)  # sorted, as imdb or an imagefolder
    hf = HfConfig(data=str(tmp_path / "data.jsonl"), seq_len=8, val_fraction=0.2)
    data = load_data(hf, "text-classification", _tokenizer(), None, seed=0)
    assert data.val is not None and len(set(data.val["labels"].tolist())) > 1
    assert data.num_labels == 3
    cut = load_data(hf.model_copy(update={"max_samples": 10}), "text-classification", _tokenizer(), None, 0)
    assert len(set(cut.train["labels"].tolist())) == 3 and cut.num_labels == 3


def test_label_names_number_alike_in_train_and_val(tmp_path: Path) -> None:
    _jsonl(tmp_path / "train.jsonl", ["a", "c", "a"])
    _jsonl(tmp_path / "val.jsonl", ["c", "b"])
    hf = HfConfig(data=str(tmp_path), seq_len=8)
    data = load_data(hf, "text-classification", _tokenizer(), None, seed=0)
    assert data.val is not None and sorted(data.val["labels"].tolist()) == [1, 2]  # b, c as train sees c
    assert sorted(data.train["labels"].tolist()) == [0, 0, 2] and data.num_labels == 3


def test_gpt2_classification_pads_with_the_tokenizers_pad_token() -> None:
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from flux_cluster.hf.model import match_padding

    model = GPT2ForSequenceClassification(
        GPT2Config(vocab_size=20, n_embd=8, n_layer=1, n_head=2, n_positions=8, num_labels=2)
    )
    ids = torch.tensor([[1, 2, 3, 5], [4, 5, 5, 5]])
    with pytest.raises(ValueError, match="padding token"):
        model(input_ids=ids)
    match_padding(model, 5)
    assert model(input_ids=ids).logits.shape == (2, 2)
    match_padding(model, 7)  # one already set stays
    assert model.config.pad_token_id == 5


def test_weights_unlike_config_are_one_line_naming_the_folder(tmp_path: Path) -> None:
    from flux_cluster.hf.model import load_model

    folder = tmp_path / "bert\x1b[2J"  # a terminal escape in the folder's name reaches no terminal
    _bert().save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 12}))
    shown = re.escape(f"{tmp_path}/bert\\x1b[2J")
    with pytest.raises(FluxClusterError, match=f"^hf.model: {shown}: the weights do not have") as error:
        load_model(folder, "text-classification")
    assert "\n" not in str(error.value) and "\x1b" not in str(error.value)


def test_lora_targets_that_are_not_linear_are_one_line() -> None:
    from flux_cluster.hf.model import lora_targets

    with pytest.raises(
        FluxClusterError, match=r"^train\.lora_targets: LayerNorm in the model .* not linear; .*query"
    ):
        lora_targets(_bert(), ["LayerNorm", "query"])
    assert lora_targets(_bert(), ["query"]) == ["query"]


def test_a_corrupt_image_met_later_is_one_line_naming_the_file(tmp_path: Path) -> None:
    from PIL import Image
    from transformers import ViTImageProcessor

    from flux_cluster.hf.data import LazyImages, SampleError

    good, bad = tmp_path / "good.png", tmp_path / "bad.png"
    Image.new("RGB", (4, 4)).save(good)
    bad.write_bytes(b"not a png")
    images = LazyImages([good, bad], ViTImageProcessor(size={"height": 4, "width": 4}), tmp_path)
    assert images[torch.arange(1)].shape == (1, 3, 4, 4)
    with pytest.raises(SampleError, match=f"^hf.data: {bad}: expected an image, cannot be read") as caught:
        images[torch.arange(2)]
    assert str(caught.value).endswith("(not a format PIL reads)")  # not PIL's '<_io.BufferedReader name=14>'
    with pytest.raises(FluxClusterError, match=f"^hf.data: {bad}: expected an image"):
        LazyImages([bad], ViTImageProcessor(), tmp_path)  # met when made: every rank's, plain error
    assert issubclass(SampleError, FluxClusterError)


def test_dp_gpus_unlike_the_system_are_one_line() -> None:
    from flux_cluster.hf.parallel import check_dp_gpus

    check_dp_gpus(8, 8)
    with pytest.raises(FluxClusterError, match=r"^system\.gpus_per_node: 8, .* sees 4 GPU\(s\)"):
        check_dp_gpus(8, 4)


def test_summary_has_gpu_hours_and_cost_of_the_run_and_its_estimate(
    one_rank: DistInfo, tmp_path: Path
) -> None:
    from flux_cluster.config import load_system
    from flux_cluster.config.workload import resolve_training
    from flux_cluster.hf.resume import HfProgress
    from flux_cluster.hf.train import _run_end
    from flux_cluster.rundir import result_log
    from flux_cluster.training.context import JobContext
    from flux_cluster.training.meter import Meter
    from flux_cluster.training.metrics import RunClock, Totals

    sets = ["train.benchmark=hf", f"hf.model={tmp_path}", "hf.task=text-classification", "hf.data=synthetic"]
    system = load_system("local", [*sets, "price_per_gpu_hour=2.0", "train.epochs=3"]).config
    ctx = JobContext(
        system, resolve_training(system), tmp_path, tmp_path, 0, 7, result_log(tmp_path, 0), False, "x"
    )
    carried = Totals(RunClock(0.0, 1800.0, 10), 80)  # 180 s a step
    meter = Meter(ctx, one_rank, flops_per_step=1e9, devices=4, peak_tflops=None, header={}, carried=carried)
    facts = {"seq_len": None, "task": "t", "parallel": "ddp", "precision": "fp32", "mode": "finetune"}
    meter.summary(_run_end(HfProgress(10, [0.5, 0.4]), 80, 5, {**facts, "model": "m"}))
    summary = json.loads(ctx.metrics_file.read_text().splitlines()[-1])["summary"]
    hours = summary["train_seconds"] / 3600 * 4
    assert summary["gpu_hours"] == pytest.approx(hours) and summary["cost_usd"] == pytest.approx(2 * hours)
    # 5 steps an epoch of 180 s, 3 epochs, 4 GPUs: 3 GPU-hours, $6
    assert summary["hf"]["estimated_gpu_hours"] == pytest.approx(3.0)
    assert summary["hf"]["estimated_cost_usd"] == pytest.approx(6.0)


def test_any_file_of_an_earlier_attempt_is_set_aside_with_its_suffix(tmp_path: Path) -> None:
    from flux_cluster.rundir import set_aside_interrupted_log

    for attempt in range(2):
        (tmp_path / "metrics_0.jsonl").write_text(str(attempt))
        set_aside_interrupted_log(tmp_path / "metrics_0.jsonl")
    set_aside_interrupted_log(tmp_path / "result_0.txt")  # none yet: nothing to do
    moved = sorted(p.name for p in (tmp_path / "interrupted").iterdir())
    assert moved == ["metrics_0.attempt0.jsonl", "metrics_0.attempt1.jsonl"]
