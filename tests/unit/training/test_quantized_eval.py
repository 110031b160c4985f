"""`evaluate` of a LoRA run on a quantized base: its base column is that quantized base (adapters off), not
the pipeline's full-precision transformer, and it says so."""

from pathlib import Path

import torch

from flux_cluster.evaluate import base_label
from flux_cluster.evaluate.run import _load_pipeline, _quantized_with_adapters_off, weights_of
from flux_cluster.evaluate.show import results_table
from flux_cluster.evaluate.target import Target
from flux_cluster.training import model as M
from flux_cluster.training import quantized_base as Q

CPU = torch.device("cpu")


def out_of(transformer: torch.nn.Module) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    config = transformer.config  # type: ignore[attr-defined]
    x = torch.randn(1, 16, 8, 8, generator=generator)
    t5 = torch.randn(1, 8, config.joint_attention_dim, generator=generator)
    clip = torch.randn(1, config.pooled_projection_dim, generator=generator)
    with torch.no_grad():
        return M.predict_velocity(transformer, x, torch.full((1,), 0.5), t5, clip, torch.float32)


def test_a_quantized_runs_base_column_is_its_quantized_base(tiny_pipeline: Path, tmp_path: Path) -> None:
    adapted = M.load_pretrained(tiny_pipeline)
    M.add_lora(adapted, 4, 4.0, ["to_q", "to_k", "to_v", "to_out.0"])
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    weights = M.save_lora(M.lora_state_dict(adapted), M.lora_metadata(adapted), tmp_path / "lora")
    target = Target(tmp_path, tmp_path, weights, "lora", tiny_pipeline, base_precision="nf4")

    pipe = _load_pipeline(tiny_pipeline, CPU, torch.float32)
    full = out_of(pipe.transformer)
    logged: list[str] = []
    _quantized_with_adapters_off(pipe, target, tiny_pipeline, CPU, torch.float32, logged.append)
    quantized = M.load_pretrained(tiny_pipeline).requires_grad_(False)
    Q.quantize_base(quantized, "nf4", torch.float32)
    base = out_of(pipe.transformer)
    assert torch.equal(base, out_of(quantized)) and not torch.equal(base, full)
    assert logged and "frozen base nf4" in logged[0]
    # its size (the result's toy-model caveat) counts the quantized layers' weights, not their buffers
    adapters = sum(p.numel() for name, p in adapted.named_parameters() if "lora_" in name)
    plain = sum(p.numel() for p in M.load_pretrained(tiny_pipeline).parameters())
    assert weights_of(pipe.transformer) == plain + adapters
    assert sum(p.numel() for p in pipe.transformer.parameters()) < plain
    pipe.transformer.enable_adapters()  # the tuned column: the same base, its adapters on
    assert not torch.equal(out_of(pipe.transformer), base)


def test_the_base_column_is_labelled_with_its_precision() -> None:
    assert base_label(None) == "base" and base_label("nf4") == "base nf4"
    latency = {"p50_s": 1.0, "p90_s": 1.0, "p99_s": 1.0, "mean_s": 1.0, "images_per_s": 1.0}
    document = {
        "target": "run",
        "device": "cpu",
        "meaningful": True,
        "latency": {
            "base": {**latency, "peak_memory_gb": None},
            "tuned": {**latency, "peak_memory_gb": None},
        },
        "clip_score": {"base": 30.0, "tuned": 31.0},
        "val_loss": None,
    }
    headers = [str(c.header) for c in results_table(document).columns]
    assert headers == ["", "base", "tuned"]
    headers = [str(c.header) for c in results_table({**document, "base_precision": "nf4"}).columns]
    assert headers == ["", "base nf4", "tuned"]
    # TARGET's name in the title: markup shown as typed, control characters spelled out
    title = results_table({**document, "target": "runs/[bold]x\x1b[2J"}).title
    assert title == "evaluate runs/\\[bold]x\\x1b[2J on cpu"


def test_the_nf4_code_book_is_made_on_the_packed_weights_device_and_not_saved() -> None:
    # evaluate quantizes after pipe.to(cuda): a CPU code book indexed by CUDA codes crashed there (the
    # CUDA case runs on a GPU only; here the meta device stands in for "not the CPU")
    layer = Q.NF4FrozenLinear(torch.nn.Linear(64, 4, device="meta"), torch.bfloat16)
    assert layer.code.device == layer.weight_nf4.device == torch.device("meta")
    moved = Q.NF4FrozenLinear(torch.nn.Linear(64, 4), torch.bfloat16).to("meta")
    assert moved.code.device == torch.device("meta")  # a buffer: .to() takes it along
    assert list(layer.state_dict()) == ["bias"]  # as checkpoints have it: the bytes are non-persistent
    assert list(Q.stored_state(layer)) == ["bias", "weight_nf4", "weight_absmax"]  # as models quantize writes


def test_a_run_on_a_pre_quantized_base_finds_the_pipeline_it_was_quantized_from(
    tiny_pipeline: Path, tmp_path: Path
) -> None:
    """`evaluate RUN` of an nf4 run trained on `models quantize`'s output (a transformer alone) asked for
    --model; the checkpoint records its source, which evaluate serves quantized as the run trained."""
    from flux_cluster.config import load_system
    from flux_cluster.evaluate import target as T
    from flux_cluster.evaluate.run import pipeline_folder
    from flux_cluster.rundir import write_run_config
    from flux_cluster.training import pretrained as P

    quantized = P.save_quantized(tiny_pipeline, tmp_path / "flux-tiny-nf4", "nf4")
    assert T.quantized_source(quantized) == tiny_pipeline and T.quantized_source(tiny_pipeline) is None
    assert (T.QUANTIZED_WEIGHTS, T.QUANTIZED_SOURCE_KEY) == (P.QUANTIZED_WEIGHTS, P.SOURCE_KEY)
    sets = [
        "train.benchmark=finetune", "train.mode=lora", f"train.pretrained_path={quantized}",
        "train.base_precision=nf4",
    ]  # fmt: skip
    run = tmp_path / "run"
    (run / "results" / "best_0").mkdir(parents=True)
    write_run_config(run, load_system("local", sets).config, {"name": "train"})
    (run / "results" / "best_0" / M.LORA_FILE).write_bytes(b"")
    target = T.resolve_target(run, 0)
    assert (target.pipeline, target.base_precision) == (tiny_pipeline, "nf4")
    assert pipeline_folder(target, None) == tiny_pipeline
    # its file damaged or its source gone: --model is asked for, as for any run without a pipeline
    (quantized / "transformer" / P.QUANTIZED_WEIGHTS).write_bytes(b"\x00" * 16)
    assert T.quantized_source(quantized) is None and T.resolve_target(run, 0).pipeline is None
