"""A tiny random-init FLUX pipeline folder, loadable offline by ``FluxPipeline.from_pretrained``.

Same layout and classes as black-forest-labs/FLUX.1-schnell (or -dev) with toy sizes: the ``tiny``
transformer preset of configs/benchmarks/flux1.yaml, a 16-channel autoencoder that downsamples 8x with
FLUX's shift/scale, CLIP and T5 text encoders whose widths match the preset's pooled and joint dims, and
tokenizers built offline. Fine-tuning and the image encoders run end to end on it without a download.
"""

import json
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

import flux_cluster.models.quiet  # noqa: F401  (before diffusers: their import-time notices go)
from flux_cluster.atomic import _default_mode
from flux_cluster.errors import FluxClusterError, write_error

if TYPE_CHECKING:
    from transformers import (
        CLIPModel,
        CLIPProcessor,
        CLIPTextConfig,
        CLIPTokenizer,
        T5TokenizerFast,
    )

Variant = Literal["schnell", "dev"]
VARIANTS: tuple[str, ...] = get_args(Variant)

TEXT_DIM = 32
"""Width of both text encoders; the tiny preset's joint_attention_dim and pooled_projection_dim."""
CLIP_TOKENS = 77
CLIP_IMAGE_SIZE = 32
CLIP_FOLDER = "clip"
"""OUT/clip/: a tiny CLIPModel + CLIPProcessor for CLIP scores (flux_cluster.evaluate.clip reads it)."""
T5_MAX_LENGTH = 512

# FLUX.1-schnell's and FLUX.1-dev's scheduler_config.json (schnell: no shift; dev: resolution-dependent).
_SCHEDULERS: dict[str, dict[str, object]] = {
    "schnell": {"shift": 1.0, "use_dynamic_shifting": False},
    "dev": {"shift": 3.0, "use_dynamic_shifting": True},
}


def _byte_unicode() -> list[str]:
    """GPT-2/CLIP's printable stand-in for each of the 256 bytes (the byte-level BPE alphabet)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _clip_vocab() -> dict[str, int]:
    """Byte-level BPE with no merges: every byte a token, word-final bytes their '</w>' form."""
    chars = _byte_unicode()
    tokens = [*chars, *(c + "</w>" for c in chars), "<|startoftext|>", "<|endoftext|>"]
    return {token: i for i, token in enumerate(tokens)}


def _clip_tokenizer() -> "CLIPTokenizer":
    from transformers import CLIPTokenizer

    return CLIPTokenizer(vocab=_clip_vocab(), merges=[], model_max_length=CLIP_TOKENS)


def _write_clip_vocab(folder: Path) -> None:
    """FLUX.1's CLIP tokenizer folder holds vocab.json and merges.txt, not tokenizer.json: the tiny one
    does too, so loading it takes the same path as loading the real one."""
    (folder / "tokenizer.json").unlink()
    (folder / "vocab.json").write_text(json.dumps(_clip_vocab(), ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n")


def _t5_tokenizer() -> "T5TokenizerFast":
    """A character-level Unigram model (T5's kind): <pad>=0, </s>=1, <unk>=2, then the word marker and the
    printable ASCII characters."""
    from transformers import T5TokenizerFast

    pieces = ["<pad>", "</s>", "<unk>", "▁", *(chr(c) for c in range(ord("!"), ord("~") + 1))]
    vocab = [(piece, 0.0 if i < 3 else -1.0) for i, piece in enumerate(pieces)]
    return T5TokenizerFast(vocab=vocab, extra_ids=0, model_max_length=T5_MAX_LENGTH)


def _clip_text_config(tokenizer: "CLIPTokenizer", width: int = TEXT_DIM) -> "CLIPTextConfig":
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=4 * TEXT_DIM,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=CLIP_TOKENS,
        projection_dim=TEXT_DIM,
        hidden_act="quick_gelu",
        # the pooled output is read at the first </s>, found by its id
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _clip_scorer() -> tuple["CLIPModel", "CLIPProcessor"]:
    """A whole CLIPModel (text and vision towers) and its processor, for `flux-cluster evaluate`'s CLIP
    score: FLUX's own CLIP is the text tower alone. Its images are CLIP_IMAGE_SIZE pixels square."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPVisionConfig

    tokenizer = _clip_tokenizer()
    vision = CLIPVisionConfig(
        hidden_size=TEXT_DIM,
        intermediate_size=4 * TEXT_DIM,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=CLIP_IMAGE_SIZE,
        patch_size=8,
        projection_dim=TEXT_DIM,
        hidden_act="quick_gelu",
    )
    config = CLIPConfig(
        text_config=_clip_text_config(tokenizer).to_dict(),
        vision_config=vision.to_dict(),
        projection_dim=TEXT_DIM,
    )
    square = {"height": CLIP_IMAGE_SIZE, "width": CLIP_IMAGE_SIZE}
    image_processor = CLIPImageProcessor(size={"shortest_edge": CLIP_IMAGE_SIZE}, crop_size=square)
    return CLIPModel(config), CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)


def _components(variant: Variant, preset: str = "tiny") -> dict[str, object]:
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5Config, T5EncoderModel

    from flux_cluster.config.workload import load_workload
    from flux_cluster.models.latents import LATENT_SCALE, LATENT_SHIFT

    args = load_workload("flux1")[0].models[preset]
    args = args.model_copy(update={"guidance_embeds": variant == "dev"})
    tokenizer, tokenizer_2 = _clip_tokenizer(), _t5_tokenizer()
    blocks = 4  # downsample factor 2 ** (blocks - 1) = 8, as FLUX's autoencoder
    return {
        "transformer": FluxTransformer2DModel(**args.model_dump()),
        "vae": AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * blocks,
            up_block_types=("UpDecoderBlock2D",) * blocks,
            block_out_channels=(16,) * blocks,
            layers_per_block=1,
            latent_channels=16,
            norm_num_groups=8,
            sample_size=64,
            scaling_factor=LATENT_SCALE,
            shift_factor=LATENT_SHIFT,
            use_quant_conv=False,
            use_post_quant_conv=False,
        ),
        "text_encoder": CLIPTextModel(_clip_text_config(tokenizer, args.pooled_projection_dim)),
        "tokenizer": tokenizer,
        "text_encoder_2": T5EncoderModel(
            T5Config(
                vocab_size=len(tokenizer_2),
                d_model=args.joint_attention_dim,
                d_kv=TEXT_DIM // 4,
                d_ff=2 * TEXT_DIM,
                num_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                relative_attention_max_distance=32,
                feed_forward_proj="gated-gelu",  # T5 v1.1, as FLUX's T5-XXL
                is_encoder_decoder=False,
                pad_token_id=0,
                eos_token_id=1,
                decoder_start_token_id=0,
            )
        ),
        "tokenizer_2": tokenizer_2,
        "scheduler": FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000,
            base_shift=0.5,
            max_shift=1.15,
            base_image_seq_len=256,
            max_image_seq_len=4096,
            **_SCHEDULERS[variant],
        ),
    }


def _check_out(out: Path, force: bool) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise FluxClusterError(
            f"{out}: exists and is not a folder (a file or a link): expected a new or empty folder"
        )
    if out.is_dir() and any(out.iterdir()) and not force:
        raise FluxClusterError(
            f"{out}: folder is not empty: expected a new or empty folder (--force replaces it)"
        )


def write_tiny_pipeline(
    out: Path,
    *,
    variant: Variant = "schnell",
    seed: int = 0,
    force: bool = False,
    kontext: bool = False,
    preset: str = "tiny",
) -> Path:
    """Write a random-init FLUX pipeline to ``out`` (a new or empty folder; ``force`` replaces a non-empty
    one) and return it. The same seed writes byte-identical files. ``kontext``: a FLUX.1-Kontext pipeline
    (``FluxKontextPipeline``; Kontext is a dev model: guidance embedding, dynamic shift). ``preset``: the
    transformer's shape preset (configs/benchmarks/flux1.yaml; e.g. 'proxy' for inference latency at
    FLUX's width), the text encoders as wide as its text dims and otherwise toy-sized; a preset other than
    'tiny' is written in bf16."""
    out = Path(out)
    variant = "dev" if kontext else variant
    if variant not in VARIANTS:
        raise FluxClusterError(f"variant {variant!r}: expected one of {', '.join(VARIANTS)}")
    _check_out(out, force)  # before the slow imports: a mistyped OUT fails at once
    import torch
    from diffusers import FluxKontextPipeline, FluxPipeline

    from flux_cluster.models.quiet import no_progress_bars

    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):  # seeded weights without touching the caller's RNG
        torch.manual_seed(seed)
        pipe = (FluxKontextPipeline if kontext else FluxPipeline)(**_components(variant, preset))
        if preset != "tiny":  # half the bytes to write and read
            pipe.to(torch.bfloat16)
        clip_model, clip_processor = _clip_scorer()  # after the pipeline: its weights stay as they were

    def fill(tmp: Path) -> None:
        with no_progress_bars():
            pipe.save_pretrained(tmp, safe_serialization=True)
            clip_model.save_pretrained(tmp / CLIP_FOLDER, safe_serialization=True)
            clip_processor.save_pretrained(tmp / CLIP_FOLDER)
        for folder in (tmp / "tokenizer", tmp / CLIP_FOLDER):
            _write_clip_vocab(folder)

    return publish_folder(out, fill)


def publish_folder(out: Path, fill: Callable[[Path], None]) -> Path:
    """Run ``fill`` on a new folder next to ``out``, then rename it onto ``out``: never a half-written
    model folder; a failed write keeps the old one."""
    tmp, old = _sibling(out, "tmp"), None
    try:
        tmp.mkdir()  # not mkdtemp: its 0700 would hide the models from teammates and containers
        fill(tmp)
        for path in tmp.rglob("*"):  # safetensors writes 0600, which would hide the weights from teammates
            if path.is_file():
                os.chmod(path, _default_mode())
        if out.is_dir() and any(out.iterdir()):
            old = _sibling(out, "old")
            os.replace(out, old)
        os.replace(tmp, out)  # replaces an empty folder too
    except OSError as exc:
        if old is not None and not out.exists():
            os.replace(old, out)
            old = None
        raise write_error(out, exc) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return out


def _sibling(out: Path, suffix: str) -> Path:
    return out.parent / f".{out.name}.{secrets.token_hex(4)}.{suffix}"
