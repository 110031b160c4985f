"""hf workload run folders as the rank side writes them (session 6's interface, issue 30): config.yaml,
results/result_0.txt (the fine-tuning MLPerf-style log) and results/metrics_0.jsonl (a header with
"workload": "hf", step lines, an evaluation, the summary with its "hf" block), for the report's tests."""

import json
from pathlib import Path
from typing import Any

T0 = 1_795_000_000_000  # run_start, ms


def _mllog(key: str, time_ms: int, value: Any = None, **metadata: Any) -> str:
    return ":::MLLOG " + json.dumps({"time_ms": time_ms, "key": key, "value": value, "metadata": metadata})


def hf_header(**changes: Any) -> dict[str, Any]:
    header = {
        "world_size": 2, "workload": "hf", "model": "bert", "task": "text-classification", "parallel": "ddp",
        "precision": "fp32", "mode": "finetune", "micro_batch_size": 8, "seq_len": 128, "params": 110_000_000,
        "trainable_params": 110_000_000, "flops_per_step": 8e14, "peak_tflops": 989.0,
    }  # fmt: skip
    return {**header, **changes}


def hf_block(**changes: Any) -> dict[str, Any]:
    block = {
        "samples_per_s": 100.0, "tokens_per_s": 12800.0, "flops_per_step": 8e14, "tflops_per_s": 250.0,
        "mfu": 0.25, "epoch_seconds": 4000.0, "estimated_total_seconds": 12000.0, "epochs": 3,
        "task": "text-classification", "parallel": "ddp", "precision": "fp32", "mode": "finetune",
        "model": "bert",
    }  # fmt: skip
    return {**block, **changes}


def hf_summary(hf: dict[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    summary = {
        "images_per_s": 100.0, "step_time_ms": 160.0, "train_seconds": 60.0, "epochs": 0.015, "steps": 300,
        "samples": 6000, "world_size": 2, "peak_memory_gb": 18.0, "final_eval_loss": 0.5,
        "hf": hf_block() if hf is None else hf,
    }  # fmt: skip
    return {**summary, **changes}


def hf_run(
    root: Path,
    *,
    header: dict[str, Any] | None = None,
    summary: dict[str, Any] | None = None,
    gpus: int = 2,
    price: float = 2.0,
    minutes: float = 1.5,
    extra: list[str] | None = None,
    with_summary: bool = True,
) -> Path:
    """One hf run folder (results/result_0.txt + metrics_0.jsonl) on a system of `gpus` GPUs at `price`."""
    header = header or hf_header()
    train = {"benchmark": "hf", "mode": header.get("mode", "finetune"), "micro_batch_size": 8}
    config = {
        "system": {
            "name": "local", "nodes": 1, "gpus_per_node": gpus, "gpu_model": "H100",
            "price_per_gpu_hour": price, "train": train,
        }
    }  # fmt: skip
    results = root / "results"
    results.mkdir(parents=True)
    (root / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    log = [_mllog("submission_benchmark", T0 - 10, "hf"), _mllog("submission_division", T0 - 9, "open")]
    log += [_mllog("run_start", T0), _mllog("block_start", T0 + 1, samples_count=6000)]
    log += [_mllog("block_stop", T0 + 1 + 60_000, samples_count=6000)]
    log += [_mllog("eval_accuracy", T0 + 61_000, 0.5, samples_count=6000, epoch_num=0.015)]
    log += [_mllog("run_stop", T0 + round(minutes * 60_000), status="success")]
    (results / "result_0.txt").write_text("\n".join(log) + "\n")
    step = {"step": 300, "epoch": 0.015, "loss": 0.6, "step_seconds": 0.16, "samples_per_s": 90.0}
    step |= {"tokens_per_s": 11520.0, "tflops_per_s": 240.0, "mfu": 0.24, "peak_memory_gb": 18.0}
    lines = [json.dumps(header), json.dumps(step)]
    lines.append(
        json.dumps({"step": 300, "samples": 6000, "eval_loss": 0.5, "epoch": 0.015, "train_seconds": 60})
    )
    lines += extra or []
    if with_summary:
        lines.append(json.dumps({"summary": summary or hf_summary()}))
    (results / "metrics_0.jsonl").write_text("\n".join(lines) + "\n")
    return root


def hf_sweep_runs(root: Path) -> dict[str, Path]:
    """Seed 002's comparisons on one model: a baseline (DDP, FP32, full, mbs 8) and one run per change."""
    variants: dict[str, dict[str, Any]] = {
        "base": {},
        "amp": {"precision": "amp-bf16"},
        "lora": {"mode": "lora", "trainable_params": 1_000_000},
        "dp": {"parallel": "dp", "world_size": 1},
        "mbs16": {"micro_batch_size": 16},
        "gpt2": {"model": "gpt2", "task": "causal-lm", "precision": "amp-bf16"},  # two changes: no pair
    }
    speed = {"base": 100.0, "amp": 200.0, "lora": 150.0, "dp": 40.0, "mbs16": 120.0, "gpt2": 80.0}
    runs = {}
    for name, change in variants.items():
        block = {k: v for k, v in change.items() if k in hf_block()}
        rate = speed[name]
        hf = hf_block(**block, samples_per_s=rate, estimated_total_seconds=1.2e6 / rate)
        summary = hf_summary(hf, images_per_s=rate)
        runs[name] = hf_run(root / name, header=hf_header(**change), summary=summary)
    return runs


def write_run_config(root: Path, *overrides: str) -> None:
    """root/config.yaml as a launch writes it: the local system with the hf workload and the overrides."""
    from flux_cluster.config import load_system

    sets = ["train.benchmark=hf", "hf.model=/models/bert", "hf.task=text-classification", "hf.data=synthetic"]
    system = load_system("local", [*sets, *overrides]).config.model_dump(mode="json")
    (root / "config.yaml").write_text(json.dumps({"system": system, "job": {}}))
