"""What `flux-cluster evaluate TARGET` points at: a run directory, fine-tuned weights, or a pipeline."""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from flux_cluster.errors import FluxClusterError, first_line
from flux_cluster.outside import OutsideFileError, read_json
from flux_cluster.safe_text import printable

WeightsKind = Literal["lora", "transformer"]
LORA_FILE = "pytorch_lora_weights.safetensors"  # flux_cluster.training.model.LORA_FILE, without torch


@dataclass(frozen=True)
class Target:
    path: Path
    run_dir: Path | None
    """Set when TARGET is a run directory: results go to its results/ folder."""
    weights: Path | None
    """The LoRA .safetensors file or the transformer folder; None for a base model alone."""
    weights_kind: WeightsKind | None
    pipeline: Path | None
    """A pipeline the target itself names: TARGET as a pipeline folder, or a run's train.pretrained_path."""
    data_root: Path | None = None
    """A run's dataset when it is here (an Energon root): its val split gives the validation loss."""
    train_guidance: float = 3.5
    """The guidance a run validated with (guidance-distilled models only)."""
    base_precision: str = "bf16"
    """A LoRA run's train.base_precision: its adapters are served on a base quantized the same way."""


def _json_object(path: Path) -> dict | None:
    """The JSON object in path, or None when there is none (missing, not a regular file, too big, not
    JSON, nested too deeply). A hub snapshot's link is followed to its blob."""
    try:
        data = read_json(os.path.realpath(path))
    except OutsideFileError:
        return None
    return data if isinstance(data, dict) else None


def is_pipeline(folder: Path) -> bool:
    data = _json_object(folder / "model_index.json")
    return data is not None and "transformer" in data


def _is_transformer(folder: Path) -> bool:
    data = _json_object(folder / "config.json")
    return data is not None and data.get("_class_name") == "FluxTransformer2DModel"


def weights_in(folder: Path) -> tuple[Path, WeightsKind] | None:
    """A LoRA file or a transformer save_pretrained folder in folder, if it holds one."""
    if (folder / LORA_FILE).is_file():
        return folder / LORA_FILE, "lora"
    if _is_transformer(folder):
        return folder, "transformer"
    loras = sorted(folder.glob("*.safetensors"))
    if len(loras) == 1 and not (folder / "config.json").exists():
        return loras[0], "lora"
    return None


QUANTIZED_WEIGHTS = "flux_cluster_quantized.safetensors"  # training.pretrained's, without torch
QUANTIZED_SOURCE_KEY = "source"
"""Its metadata key naming the checkpoint ``models quantize`` read (training.pretrained.SOURCE_KEY)."""


def quantized_source(folder: Path) -> Path | None:
    """The checkpoint a pre-quantized one (``flux-cluster models quantize``) was quantized from, as its
    file's metadata records it; None for any other folder, a damaged file, or one written before the
    source was recorded. Only the safetensors header is read (no torch)."""
    from safetensors import safe_open

    for file in (folder / "transformer" / QUANTIZED_WEIGHTS, folder / QUANTIZED_WEIGHTS):
        if file.is_file():
            try:
                with safe_open(str(file), framework="numpy") as handle:
                    source = (handle.metadata() or {}).get(QUANTIZED_SOURCE_KEY)
            except Exception:  # safetensors' own error type for a file that is not one
                return None
            return Path(source) if isinstance(source, str) and source else None
    return None


def resolve_target(path: Path, exp: int) -> Target:
    from flux_cluster.rundir import config_file

    expected = (
        "expected a run directory (config.yaml, results/best_<i>/), LoRA weights (.safetensors file or its "
        "folder), a fine-tuned transformer folder, or a FLUX pipeline folder (model_index.json)"
    )
    shown = printable(str(path))
    if not path.exists():
        raise FluxClusterError(f"TARGET {shown}: does not exist: {expected}")
    if path.is_file():
        if path.suffix != ".safetensors":
            raise FluxClusterError(f"TARGET {shown}: not a .safetensors file: {expected}")
        return Target(path, None, path, "lora", None)
    if config_file(path).is_file():
        return _run_target(path, exp)
    if is_pipeline(path):
        return Target(path, None, None, None, path)
    found = weights_in(path)
    if found is None:
        raise FluxClusterError(f"TARGET {shown}: nothing to evaluate in this folder: {expected}")
    return Target(path, None, found[0], found[1], None)


def _run_target(run_dir: Path, exp: int) -> Target:
    from flux_cluster.rundir import best_dir, config_file, read_run_config

    try:
        system, _job = read_run_config(config_file(run_dir))
    except (KeyError, TypeError, ValueError) as exc:  # another version's or a hand-edited config.yaml
        raise FluxClusterError(
            f"{config_file(run_dir)}: not a flux-cluster run config ({first_line(exc)})"
        ) from None
    best = best_dir(run_dir, exp)
    found = weights_in(best) if best.is_dir() else None
    if found is None:
        raise FluxClusterError(
            f"{run_dir}: no fine-tuned weights in {best.relative_to(run_dir)}/ (expected {LORA_FILE} or a "
            "transformer folder, written at a fine-tuning run's first evaluation; --exp picks a repeat)"
        )
    pretrained = Path(system.train.pretrained_path) if system.train.pretrained_path else None
    base = quantized_source(pretrained) if pretrained else None  # pre-quantized: what it was made from
    pipeline = next((p for p in (pretrained, base) if p is not None and is_pipeline(p)), None)
    root = system.paths.data_root
    data_root = Path(root) if root and (Path(root) / ".nv-meta").is_dir() else None
    return Target(
        run_dir,
        run_dir,
        found[0],
        found[1],
        pipeline,
        data_root,
        system.train.guidance_scale,
        system.train.base_precision if system.train.mode == "lora" else "bf16",
    )
