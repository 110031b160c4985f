"""CLIP score of images against their prompts, with transformers' CLIPModel and CLIPProcessor from a
local folder (nothing is downloaded)."""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flux_cluster.errors import FluxClusterError
from flux_cluster.evaluate import first_line

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image
    from transformers import CLIPModel, CLIPProcessor

CLIP_FOLDER = "clip"
"""A CLIPModel + CLIPProcessor folder inside a pipeline folder (`flux-cluster models tiny` writes one)."""


def _has_vision_tower(folder: Path) -> bool:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def find_clip(pipeline: Path, clip: Path | None) -> Path:
    """--clip, else the pipeline's clip/ folder, else its text_encoder/ if that is a whole CLIPModel."""
    if clip is not None:
        if not _has_vision_tower(clip):
            raise FluxClusterError(
                f"--clip {clip}: no CLIPModel with a vision tower (config.json with vision_config): "
                "expected a local CLIP folder such as a download of openai/clip-vit-large-patch14"
            )
        return clip
    for folder in (pipeline / CLIP_FOLDER, pipeline / "text_encoder"):
        if _has_vision_tower(folder):
            return folder
    raise FluxClusterError(
        f"{pipeline}: no CLIP vision weights (neither {CLIP_FOLDER}/ nor a text_encoder/ with a vision "
        "tower): pass --clip PATH, a local CLIP folder such as openai/clip-vit-large-patch14"
    )


@dataclass
class ClipScorer:
    model: "CLIPModel"
    processor: "CLIPProcessor"
    folder: Path

    @classmethod
    def load(cls, folder: Path, pipeline: Path, device: "torch.device") -> "ClipScorer":
        """The model from folder; its processor from there too, else (a pipeline's text_encoder/) the
        pipeline's CLIP tokenizer with CLIP's standard image preprocessing at the model's image size."""
        from transformers import CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

        from flux_cluster.models.quiet import held_transformers_logs, no_progress_bars

        try:
            with no_progress_bars(), held_transformers_logs():
                model = CLIPModel.from_pretrained(folder, local_files_only=True)
                if any(
                    (folder / name).is_file()
                    for name in ("processor_config.json", "preprocessor_config.json")
                ):
                    processor = CLIPProcessor.from_pretrained(folder, local_files_only=True)
                else:
                    size = model.config.vision_config.image_size
                    processor = CLIPProcessor(
                        image_processor=CLIPImageProcessor(
                            size={"shortest_edge": size}, crop_size={"height": size, "width": size}
                        ),
                        tokenizer=CLIPTokenizer.from_pretrained(
                            pipeline / "tokenizer", local_files_only=True
                        ),
                    )
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise FluxClusterError(
                f"{folder}: cannot load a CLIP model and processor from it ({first_line(exc)})"
            ) from None
        return cls(model.to(device).eval(), processor, folder)

    def score(self, images: Sequence["Image"], prompts: Sequence[str]) -> float:
        return clip_score(self.model, self.processor, images, prompts)


def clip_score(
    model: "CLIPModel", processor: "CLIPProcessor", images: Sequence["Image"], prompts: Sequence[str]
) -> float:
    """Mean over the images of 100 * max(cos(image embedding, prompt embedding), 0): CLIPScore as
    torchmetrics documents it (its code clamps the mean instead; the two agree unless a cosine is negative).
    Prompts longer than CLIP's context are cut to it."""
    import torch

    if len(images) != len(prompts) or not images:
        raise ValueError(f"{len(images)} images for {len(prompts)} prompts")
    device = next(model.parameters()).device
    max_length = model.config.text_config.max_position_embeddings
    inputs: Any = processor(
        text=list(prompts),
        images=list(images),
        return_tensors="pt",
        padding=True,
        truncation=True,
        max_length=max_length,
    )
    with torch.no_grad():
        out = model(**{k: v.to(device) for k, v in inputs.items()})
    image = out.image_embeds / out.image_embeds.norm(p=2, dim=-1, keepdim=True)
    text = out.text_embeds / out.text_embeds.norm(p=2, dim=-1, keepdim=True)
    cosine = (image * text).sum(dim=-1).float()
    return float((100 * cosine.clamp(min=0)).mean().item())
