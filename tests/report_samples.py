"""What the report tests share: the real MLPerf v5.1 sample, a real LoRA run, an eval document."""

import tarfile
from pathlib import Path
from typing import Any

import pytest

ARCHIVE = Path(__file__).resolve().parent / "data" / "mlperf_v51_sample.tar.xz"


LORA_RUN = ARCHIVE.parent / "local_lora_run"
"""A real LoRA run of --system local (tests/data/README.md): 640 samples, division open."""


GROUP = Path("NVIDIA/results/tyche_ngpu16_ngc25.09_nemo/flux1")


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real v5.1 logs (tests/data/README.md), unpacked once."""
    root = tmp_path_factory.mktemp("v51")
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(root, filter="data")
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root / "mlperf_v51_sample"


def _latency(p50: float, **changes: Any) -> dict[str, Any]:
    latency = {
        "p50_s": p50, "p90_s": p50 * 1.1, "p99_s": p50 * 1.2, "mean_s": p50 * 1.05,
        "images_per_s": 1 / p50, "peak_memory_gb": 30.5, "samples": 100,
    }  # fmt: skip
    return {**latency, **changes}


def eval_document(**changes: Any) -> dict[str, Any]:
    document = {
        "schema": 1, "kind": "flux-cluster-eval", "created": "2026-11-23T10:00:00+00:00", "system": "a",
        "device": "NVIDIA H100 80GB HBM3", "model": "/models/FLUX.1-schnell", "target": "runs/a",
        "weights": "runs/a/results/best_0", "weights_kind": "lora", "meaningful": True,
        "meaningful_reason": None,
        "settings": {"steps": 4, "guidance": 0.0, "resolution": 512, "runs": 100, "warmup": 2, "prompts": 8,
                     "seed": 0},
        "latency": {"base": _latency(0.5), "tuned": _latency(0.6)},
        "clip_score": {"base": 30.25, "tuned": 31.5, "clip_model": "openai/clip-vit-large-patch14"},
        "val_loss": {"base": 0.52, "tuned": 0.44}, "grid": "eval_0_grid.png",
    }  # fmt: skip
    return {**document, **changes}
