"""CLIP score of images against their prompts, with transformers' CLIPModel and CLIPProcessor from a
local folder (nothing is downloaded)."""

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flux_cluster.errors import FluxClusterError, first_line
from flux_cluster.outside import OutsideFileError, read_json

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image
    from transformers import CLIPModel, CLIPProcessor

CLIP_FOLDER = "clip"
"""A CLIPModel + CLIPProcessor folder inside a pipeline folder (`flux-cluster models tiny` writes one)."""


WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""A CLIPModel's weights as transformers saves them (a link into a cache's blobs counts if it resolves)."""
CLIP_ADVICE = "pass --clip PATH, a local CLIP folder such as a download of openai/clip-vit-large-patch14"


def _config(folder: Path) -> dict[str, Any]:
    """folder's config.json as a dict; {} when unusable (a hub snapshot's link is followed to its blob)."""
    try:
        config = read_json(os.path.realpath(folder / "config.json"))
    except OutsideFileError:
        return {}
    return config if isinstance(config, dict) else {}


def _has_vision_weights(folder: Path) -> bool:
    """A whole CLIPModel: a config with a vision tower, and weights beside it."""
    return isinstance(_config(folder).get("vision_config"), dict) and any(
        (folder / name).is_file() for name in WEIGHT_FILES
    )


def find_clip(pipeline: Path, clip: Path | None) -> Path:
    """--clip; else the pipeline's clip/ folder; else its text_encoder/ if that is a whole CLIPModel; else
    the model its text_encoder/ was made from (a real FLUX text_encoder/ is CLIP's text tower alone, its
    config's _name_or_path naming openai/clip-vit-large-patch14): that folder, or that repository in the
    local Hugging Face cache (HF_HUB_CACHE; nothing is downloaded), if it holds the vision weights."""
    if clip is not None:
        if not _has_vision_weights(clip):
            raise FluxClusterError(
                f"--clip {clip}: no CLIPModel with a vision tower (config.json with vision_config and its "
                "weights): expected a local CLIP folder such as a download of openai/clip-vit-large-patch14"
            )
        return clip
    for folder in (pipeline / CLIP_FOLDER, pipeline / "text_encoder"):
        if _has_vision_weights(folder):
            return folder
    looked = [f"{CLIP_FOLDER}/", "text_encoder/ as a whole CLIPModel"]
    source = _config(pipeline / "text_encoder").get("_name_or_path")
    if isinstance(source, str) and source:
        found, where = _named_clip(source)
        if found is not None:
            return found
        looked.append(where)
    else:
        looked.append("the model text_encoder/config.json names in _name_or_path: none")
    raise FluxClusterError(
        f"{pipeline}: no CLIP vision weights (looked for {'; '.join(looked)}): {CLIP_ADVICE}"
    )


def _named_clip(source: str) -> tuple[Path | None, str]:
    """The CLIP folder a text encoder's _name_or_path names, if it has the vision weights; else None and
    what was looked for. A local folder as it is, else a Hugging Face repository in the local cache."""
    folder = Path(source).expanduser()
    if folder.is_dir():
        return (folder, "") if _has_vision_weights(folder) else (None, f"{folder}: no vision weights there")
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(source, "config.json")  # the snapshot of its main revision
    except ValueError:  # not a repository id (huggingface_hub's HFValidationError)
        return None, f"{source}, text_encoder/'s _name_or_path: neither a folder nor a repository id"
    where = f"{source} in the Hugging Face cache {constants.HF_HUB_CACHE}"
    if not isinstance(cached, str):
        return None, f"{where}: not there"
    snapshot = Path(cached).parent
    if _has_vision_weights(snapshot):
        return snapshot, ""
    return None, f"{where}: there, but without the vision weights"


def clip_mount(folder: Path) -> Path:
    """What a container must see for a CLIP folder to load: the folder itself, or for a Hugging Face cache
    snapshot (snapshots/<commit>/, its files links into ../../blobs/) the repository's cache folder."""
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent
    return folder


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
                # never the folder's own code: an auto_map would have transformers ask to run it
                model = CLIPModel.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
                if any(
                    (folder / name).is_file()
                    for name in ("processor_config.json", "preprocessor_config.json")
                ):
                    processor = CLIPProcessor.from_pretrained(
                        folder, local_files_only=True, trust_remote_code=False
                    )
                else:
                    size = model.config.vision_config.image_size
                    processor = CLIPProcessor(
                        image_processor=CLIPImageProcessor(
                            size={"shortest_edge": size}, crop_size={"height": size, "width": size}
                        ),
                        tokenizer=CLIPTokenizer.from_pretrained(
                            pipeline / "tokenizer", local_files_only=True, trust_remote_code=False
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
