"""Tiny random-init Hugging Face models for the hf workload, loadable offline by the Auto classes.

``bert`` (AutoModelForSequenceClassification, BertTokenizerFast), ``gpt2`` (AutoModelForCausalLM,
GPT2TokenizerFast) and ``vit`` (AutoModelForImageClassification, ViTImageProcessor): the real models'
classes and file layout with toy sizes, so the hf workload, its tests and the README run without a
download. Both tokenizers split any English text (WordPiece with common and data synth-hf's words whole,
other words in characters; byte-level BPE), so the README's example learns synth-hf's reviews in 3
epochs (a character-level vocabulary left its validation loss at ln 2: too many steps to find words)."""

import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

import flux_cluster.models.quiet  # noqa: F401  (before transformers: its import-time notices go)
from flux_cluster.errors import FluxClusterError
from flux_cluster.models.tiny import _byte_unicode, _check_out, publish_folder

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Kind = Literal["bert", "gpt2", "vit"]
KINDS: tuple[str, ...] = get_args(Kind)

TASKS: dict[str, str] = {"bert": "text-classification", "gpt2": "causal-lm", "vit": "image-classification"}
"""The hf.task each tiny model is for."""
WIDTH = 32
LAYERS = 2
HEADS = 4
MAX_TOKENS = 128
IMAGE_SIZE = 32
LABELS = ("negative", "positive")
"""Text classes; data synth-hf writes the same two."""
IMAGE_LABELS = ("circle", "square")
"""Image classes; data synth-hf writes the same two folders."""
POSITIVE = ("wonderful", "bright", "great", "lovely", "moving", "clever", "warm", "superb", "fun", "sharp")
NEGATIVE = ("dull", "awful", "boring", "weak", "messy", "slow", "bland", "poor", "tired", "clumsy")
NOUNS = ("movie", "story", "acting", "music", "ending", "script", "cast", "plot", "scene", "camera")
VERBS = ("was", "felt", "seemed", "looked", "sounded")
"""data synth-hf's reviews are sentences of these (a positive review's adjectives from POSITIVE)."""
COMMON_WORDS = (
    "the", "a", "an", "and", "or", "but", "of", "to", "in", "on", "at", "for", "with", "is", "are", "be",
    "it", "this", "that", "not", "no", "very", "so", "too", "all", "just", "good", "bad", "film", "really",
)  # fmt: skip
"""Whole words of the tiny BERT's vocabulary besides synth-hf's (bert-base's has 30,000 word pieces):
a review's words are one token each, as in the real model, not a dozen characters."""
_ENDOFTEXT = "<|endoftext|>"


@dataclass(frozen=True)
class HfSize:
    """A model's width, depth, heads and positions (the MLP is 4x the width)."""

    width: int
    layers: int
    heads: int
    positions: int


SIZES: dict[str, HfSize] = {
    "tiny": HfSize(WIDTH, LAYERS, HEADS, MAX_TOKENS),
    "base": HfSize(768, 12, 12, 512),
}
"""``tiny``: toy sizes for CPU tests; ``base``: bert-base / gpt2 / vit-base's shapes (random weights, the
tiny vocabularies), for measuring a real-sized model on a GPU (benchmarks/gpu_check.sh)."""


def _bert_vocab() -> list[str]:
    """BERT's special tokens, whole words (COMMON_WORDS and synth-hf's), then every lowercase-ASCII
    printable character, typographic punctuation and the pound and euro signs, each with its '##'
    continuation: any other lowercased English word (accents are stripped) splits into characters; other
    characters become [UNK]."""
    typographic = "\u2018\u2019\u201c\u201d\u2013\u2014\u2026\u00a3\u20ac\u00b0"  # quotes, dashes, ...
    chars = [c for c in string.printable if not c.isspace() and not c.isupper()] + list(typographic)
    words = dict.fromkeys((*COMMON_WORDS, *NOUNS, *VERBS, *POSITIVE, *NEGATIVE))  # in order, once each
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *chars, *("##" + c for c in chars)]


def _labels(names: tuple[str, ...]) -> dict[str, object]:
    return {"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}


def _bert(folder: Path, size: HfSize) -> "PreTrainedModel":
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    tokens = _bert_vocab()
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n")  # bert-base's layout has it too
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = BertTokenizerFast(vocab=vocab, do_lower_case=True, model_max_length=size.positions)
    tokenizer.save_pretrained(folder)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.width,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        intermediate_size=4 * size.width,
        max_position_embeddings=size.positions,
        pad_token_id=tokenizer.pad_token_id,
        **_labels(LABELS),
    )
    return BertForSequenceClassification(config)


def _gpt2(folder: Path, size: HfSize) -> "PreTrainedModel":
    """Byte-level BPE with every byte a token and no merges, as GPT-2's vocab.json + merges.txt; its
    end-of-text token pads too (GPT-2 has no pad token)."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    vocab = {token: i for i, token in enumerate([*_byte_unicode(), _ENDOFTEXT])}
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = GPT2TokenizerFast(
        vocab=vocab,
        merges=[],
        model_max_length=size.positions,
        pad_token=_ENDOFTEXT,
    )
    tokenizer.save_pretrained(folder)
    eos = vocab[_ENDOFTEXT]
    config = GPT2Config(
        vocab_size=len(vocab),
        n_embd=size.width,
        n_layer=size.layers,
        n_head=size.heads,
        n_positions=size.positions,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    return GPT2LMHeadModel(config)


def _vit(folder: Path, size: HfSize) -> "PreTrainedModel":
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    ViTImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(folder)
    config = ViTConfig(
        image_size=IMAGE_SIZE,
        patch_size=8,
        hidden_size=size.width,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        intermediate_size=4 * size.width,
        **_labels(IMAGE_LABELS),
    )
    return ViTForImageClassification(config)


_BUILDERS = {"bert": _bert, "gpt2": _gpt2, "vit": _vit}


def write_tiny_hf(out: Path, *, kind: Kind, seed: int = 0, force: bool = False, size: str = "tiny") -> Path:
    """Write a random-init ``kind`` model with its tokenizer or image processor to ``out`` (a new or
    empty folder; ``force`` replaces a non-empty one) and return it. The same seed writes the same
    weights. ``size``: one of SIZES."""
    out = Path(out)
    if kind not in KINDS:
        raise FluxClusterError(f"kind {kind!r}: expected one of {', '.join(KINDS)}")
    if size not in SIZES:
        raise FluxClusterError(f"size {size!r}: expected one of {', '.join(SIZES)}")
    _check_out(out, force)  # before the slow imports: a mistyped OUT fails at once
    import torch

    from flux_cluster.models.quiet import no_progress_bars

    out.parent.mkdir(parents=True, exist_ok=True)

    def fill(tmp: Path) -> None:
        with torch.random.fork_rng(devices=[]):  # seeded weights without touching the caller's RNG
            torch.manual_seed(seed)
            model = _BUILDERS[kind](tmp, SIZES[size])
        with no_progress_bars():
            model.save_pretrained(tmp, safe_serialization=True)

    return publish_folder(out, fill)
