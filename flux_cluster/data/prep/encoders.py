"""FLUX's own encoders, read from a local diffusers FLUX pipeline folder: images to VAE latents and
captions to T5 and CLIP encodings, in the MLPerf sample schema (see flux_cluster/data/format.py).

The latents are the autoencoder's raw latent distribution (mean, logvar); training applies FLUX's
shift/scale itself (flux_cluster/training/rectified_flow.py), so the folder's VAE must use the same
constants. The captions go through ``FluxPipeline.encode_prompt``, so the encodings are exactly those
FLUX is conditioned on at inference.
"""

import hashlib
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

import torch

from flux_cluster.errors import FluxClusterError
from flux_cluster.models.latents import LATENT_SCALE, LATENT_SHIFT
from flux_cluster.models.quiet import held_transformers_logs, no_progress_bars
from flux_cluster.outside import OutsideFileError, read_json

LATENT_CHANNELS = 16
ENCODER_PARTS = ("vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
"""The pipeline subfolders the encoders read (the transformer is never loaded)."""
_EDGE = 64 * 1024  # bytes hashed at each end of a file by model_fingerprint
_FINGERPRINT_VERSION = b"flux-encoders-fingerprint 1\n"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _read_json(path: Path) -> dict[str, Any]:
    """A diffusers config: bounded, a regular file (a hub snapshot's link is followed to its blob), one
    line for anything else (deep nesting and 4,300+-digit numbers included)."""
    try:
        data = read_json(os.path.realpath(path))
    except OutsideFileError as exc:
        reason = str(exc).removeprefix(f"{os.path.realpath(path)}: ")
        raise FluxClusterError(f"{path}: not readable JSON ({reason}): expected a diffusers config") from None
    if not isinstance(data, dict):
        raise FluxClusterError(f"{path}: expected a JSON object (a diffusers config)")
    return data


def check_pipeline_dir(pipeline_dir: Path) -> None:
    """One FluxClusterError line for the first thing missing or wrong in a FLUX pipeline folder, before
    any slow load: the folder, model_index.json, the encoder subfolders, the autoencoder's latent layout."""
    expected = (
        "expected a diffusers FLUX pipeline folder (e.g. FLUX.1-schnell, or 'flux-cluster models tiny')"
    )
    if not pipeline_dir.is_dir():
        raise FluxClusterError(f"{pipeline_dir}: no such folder: {expected}")
    if not (pipeline_dir / "model_index.json").is_file():
        raise FluxClusterError(f"{pipeline_dir / 'model_index.json'}: missing: {expected}")
    _read_json(pipeline_dir / "model_index.json")
    for part in ENCODER_PARTS:
        if not (pipeline_dir / part).is_dir():
            raise FluxClusterError(
                f"{pipeline_dir / part}: missing: expected the pipeline's {part} subfolder"
            )
    vae_config = pipeline_dir / "vae" / "config.json"
    if not vae_config.is_file():
        raise FluxClusterError(f"{vae_config}: missing: expected the autoencoder's diffusers config")
    config = _read_json(vae_config)
    if config.get("latent_channels") != LATENT_CHANNELS:
        raise FluxClusterError(
            f"{vae_config}: latent_channels is {config.get('latent_channels')!r}, expected {LATENT_CHANNELS} "
            "(FLUX's autoencoder)"
        )
    for key, flux_value in (("shift_factor", LATENT_SHIFT), ("scaling_factor", LATENT_SCALE)):
        value = config.get(key)
        if not isinstance(value, int | float) or not math.isclose(value, flux_value, rel_tol=1e-6):
            raise FluxClusterError(
                f"{vae_config}: {key} is {value!r}, expected FLUX's {flux_value} "
                "(training applies it to the latents)"
            )


def _load_failure(exc: Exception, held: list[logging.LogRecord]) -> str:
    reports = [r.getMessage() for r in held if "LOAD REPORT" in r.getMessage()]
    if reports and "above report" in str(exc):  # "<Model> LOAD REPORT from: <folder>", then the table
        model, _, folder = _ANSI.sub("", reports[-1].splitlines()[0]).partition(" LOAD REPORT from: ")
        return f"{model} in {folder}: its weights do not fit its config.json"
    detail = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {detail}"


class FluxEncoders:
    """The VAE encoder and both text encoders of one pipeline folder, on one device, in eval mode."""

    def __init__(self, pipe: Any, device: torch.device, dtype: torch.dtype, max_sequence_length: int) -> None:
        self.pipe = pipe
        self.device = device
        self.dtype = dtype
        self.t5_tokens = max_sequence_length
        self.t5_dim: int = pipe.text_encoder_2.config.d_model
        self.clip_dim: int = pipe.text_encoder.config.hidden_size  # the pooled output's width
        self.latent_channels: int = pipe.vae.config.latent_channels
        self.downsample: int = pipe.vae_scale_factor

    @classmethod
    def load(
        cls,
        pipeline_dir: Path,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        max_sequence_length: int = 256,
    ) -> "FluxEncoders":
        """Load through diffusers' own path, without the transformer (the largest part, not needed)."""
        pipeline_dir = Path(pipeline_dir)
        check_pipeline_dir(pipeline_dir)
        if max_sequence_length < 1:
            raise FluxClusterError(
                f"max_sequence_length {max_sequence_length}: expected a positive token count"
            )
        with no_progress_bars(), held_transformers_logs() as held:
            try:
                from diffusers import FluxPipeline

                pipe = FluxPipeline.from_pretrained(  # never the folder's own code
                    pipeline_dir,
                    transformer=None,
                    local_files_only=True,
                    dtype=dtype,
                    trust_remote_code=False,
                )
                pipe.to(device)
            except Exception as exc:  # diffusers/transformers raise many kinds; the user needs one line
                raise FluxClusterError(
                    f"{pipeline_dir}: could not load the FLUX encoders ({_load_failure(exc, held)})"
                ) from None
        for model in (pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
            model.eval().requires_grad_(False)
        return cls(pipe, torch.device(device), dtype, max_sequence_length)

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pixels [B, 3, H, W] in [-1, 1] -> the raw latent distribution (mean, logvar), each
        [B, 16, H/8, W/8] float32 (no shift/scale)."""
        if pixels.ndim != 4 or pixels.shape[1] != 3 or any(s % self.downsample for s in pixels.shape[2:]):
            raise FluxClusterError(
                f"images of shape {list(pixels.shape)}: expected [batch, 3, height, width] with height "
                f"and width multiples of {self.downsample}"
            )
        dist = self.pipe.vae.encode(pixels.to(self.device, self.dtype)).latent_dist
        return dist.mean.float(), dist.logvar.float()

    @torch.no_grad()
    def encode_captions(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """captions -> (T5 hidden states [B, t5_tokens, t5_dim], CLIP pooled [B, clip_dim]), float32,
        exactly as FluxPipeline.encode_prompt gives them."""
        t5, clip, _ = self.pipe.encode_prompt(
            prompt=list(captions), device=self.device, max_sequence_length=self.t5_tokens
        )
        return t5.float(), clip.float()


def model_fingerprint(pipeline_dir: Path) -> str:
    """A stable id of the encoders in a pipeline folder, the same for any copy of it: each file's
    relative name, size and the sha256 of its first and last 64 KiB (never a whole multi-GB file)."""
    pipeline_dir = Path(pipeline_dir)
    check_pipeline_dir(pipeline_dir)
    files = [pipeline_dir / "model_index.json"]
    for part in ENCODER_PARTS:  # rglob yields files that are links (a hub cache's snapshot) too
        files += sorted(p for p in (pipeline_dir / part).rglob("*") if p.is_file())
    digest = hashlib.sha256(_FINGERPRINT_VERSION)
    for path in files:
        name = path.relative_to(pipeline_dir).as_posix()
        if any(piece.startswith(".") for piece in name.split("/")):
            continue  # .DS_Store, editor and download leftovers: not part of the model
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(0)
            edges = hashlib.sha256(handle.read(_EDGE))
            if size > _EDGE:
                handle.seek(size - _EDGE)
                edges.update(handle.read(_EDGE))
        digest.update(f"{name}\0{size}\0{edges.hexdigest()}\n".encode())
    return digest.hexdigest()
