"""Tiny local datasets for the hf workload (``flux-cluster data synth-hf``), one per task, in formats
``hf.data`` reads, learnable by the tiny models of ``flux-cluster models tiny --kind bert|gpt2|vit``:

- text-classification: OUT/train.jsonl and OUT/val.jsonl, one ``{"text": ..., "label": 0|1}`` a line
  (label 1: a sentence of positive words; the labels of models/tiny_hf.LABELS);
- causal-lm: the same files with ``{"text": ...}`` lines;
- image-classification: an imagefolder, OUT/train/<class>/*.png and OUT/val/<class>/*.png (a circle or
  a square in a random colour and place; the classes of models/tiny_hf.IMAGE_LABELS).

The folder is written next to OUT and renamed onto it: never a half-written dataset.
"""

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from flux_cluster.data.prep.progress import StageProgress
from flux_cluster.errors import FluxClusterError
from flux_cluster.models.tiny import _check_out, publish_folder
from flux_cluster.models.tiny_hf import IMAGE_LABELS, IMAGE_SIZE, NEGATIVE, NOUNS, POSITIVE, VERBS

if TYPE_CHECKING:
    from PIL.Image import Image
    from rich.console import Console

SynthKind = Literal["text-classification", "causal-lm", "image-classification"]
SYNTH_KINDS: tuple[str, ...] = get_args(SynthKind)
SPLITS = ("train", "val")


def _review(rng: random.Random, label: int) -> str:
    words = POSITIVE if label else NEGATIVE
    clauses = [
        f"the {rng.choice(NOUNS)} {rng.choice(VERBS)} {rng.choice(words)}" for _ in range(rng.randint(2, 4))
    ]
    return (" and ".join(clauses) + rng.choice((".", "!", "..."))).capitalize()


def _text_lines(kind: str, count: int, rng: random.Random) -> list[str]:
    lines = []
    for i in range(count):
        label = i % 2  # balanced
        record: dict[str, object] = {"text": _review(rng, label)}
        if kind == "text-classification":
            record["label"] = label
        lines.append(json.dumps(record) + "\n")
    return lines


def _image(rng: random.Random, label: str) -> "Image":
    from PIL import Image, ImageDraw

    background = tuple(rng.randrange(0, 96) for _ in range(3))
    colour = tuple(rng.randrange(128, 256) for _ in range(3))
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), background)
    size = rng.randint(IMAGE_SIZE // 3, IMAGE_SIZE // 2)
    x, y = rng.randint(0, IMAGE_SIZE - size - 1), rng.randint(0, IMAGE_SIZE - size - 1)
    shape = ImageDraw.Draw(image).ellipse if label == "circle" else ImageDraw.Draw(image).rectangle
    shape((x, y, x + size, y + size), fill=colour)
    return image


def synthesize_hf(
    out: Path,
    kind: SynthKind,
    *,
    train: int = 256,
    val: int = 32,
    seed: int = 0,
    force: bool = False,
    console: "Console | None" = None,
) -> dict[str, int]:
    """Write ``train`` and ``val`` samples of ``kind`` to ``out`` (a new or empty folder; ``force``
    replaces a non-empty one); returns the samples per split. The same seed writes the same data."""
    out = Path(out)
    if kind not in SYNTH_KINDS:
        raise FluxClusterError(f"--kind {kind!r}: expected one of {', '.join(SYNTH_KINDS)}")
    if train < 1 or val < 0:
        raise FluxClusterError(f"--train {train} --val {val}: expected at least 1 train and 0 or more val")
    _check_out(out, force)
    counts = {"train": train, "val": val}
    rng = random.Random(seed)
    out.parent.mkdir(parents=True, exist_ok=True)

    def fill(tmp: Path) -> None:
        with StageProgress(f"synth-hf {kind}", train + val, console) as progress:
            for split, count in counts.items():
                if count == 0:  # no val split: hf.val_fraction holds out some train samples instead
                    continue
                if kind == "image-classification":
                    for label in IMAGE_LABELS:
                        (tmp / split / label).mkdir(parents=True)
                    for i in range(count):
                        label = IMAGE_LABELS[i % len(IMAGE_LABELS)]
                        path = tmp / split / label / f"{i:06d}.png"
                        _image(rng, label).save(path)
                        progress.advance(1, path.stat().st_size)
                else:
                    lines = _text_lines(kind, count, rng)
                    (tmp / f"{split}.jsonl").write_text("".join(lines))
                    progress.advance(count, sum(len(line) for line in lines))

    publish_folder(out, fill)
    return counts
