"""Edit pairs (issue 29, seed 004): a control image, a target image and a prompt, for FLUX Kontext.

Two layouts, detected from what the folder holds:

- ``control_images/NAME.(jpg|png)`` and ``training_images/NAME.(png|jpg)`` with ``training_images/NAME.txt``
  (the prompt): pairs matched by NAME.
- ``metadata.jsonl`` whose records carry ``control_file_name``, ``file_name`` and ``text``, paths relative
  to the folder.

Any other folder is a text-to-image folder (flux_cluster.data.prep.image_folder). As there, every item
that cannot be used is one line in ``FolderScan.problems`` (or, strict, the error) naming its path and
why. An edit pair is encoded as its target (the usual columns) plus the control's latent mean
(format.CONTROL_COLUMN): the same cache, chunks and shards as a text-to-image folder.
"""

import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flux_cluster.data.prep.image_folder import (
    IMAGE_SUFFIXES,
    PATH_KEYS,
    FolderScan,
    ImageRecord,
    _Inside,
    _lines,
    _MetadataReader,
    _pick,
    _read_caption,
    _scan_metadata,
    finish_scan,
    load_image,
    scan_folder,
    to_pixels,
)
from flux_cluster.outside import OutsideFileError, open_regular
from flux_cluster.safe_text import printable

CONTROL_DIR = "control_images"
TARGET_DIR = "training_images"
CONTROL_KEY = "control_file_name"
FOLDER_LAYOUT = "edit-pairs"
JSONL_LAYOUT = "edit-pairs metadata.jsonl"
EDIT_LAYOUTS = (FOLDER_LAYOUT, JSONL_LAYOUT)
_SHOWN = 200
"""Characters of a path from metadata.jsonl shown in a problem line (a line may be a megabyte)."""
_PEEK_LINES = 32
"""metadata.jsonl is an edit-pair list when one of its first records names a control file."""


@dataclass(frozen=True)
class EditPair(ImageRecord):
    """An ImageRecord (the target image and its prompt) with its control image."""

    control: Path
    control_name: str


def is_edit_layout(layout: str) -> bool:
    return layout in EDIT_LAYOUTS


def scan_images(root: Path, *, strict: bool = False) -> FolderScan:
    """An edit-pair folder's pairs, else scan_folder's captioned images."""
    root = Path(root)
    if (root / CONTROL_DIR).is_dir() and not os.path.lexists(root / "metadata.jsonl"):
        problems: list[str] = []
        return finish_scan(root, FOLDER_LAYOUT, _scan_pair_folders(root, problems), problems, strict)
    if _jsonl_has_controls(root):
        problems = []
        return finish_scan(root, JSONL_LAYOUT, _scan_pair_jsonl(root, problems), problems, strict)
    return scan_folder(root, strict=strict)


def _images_by_stem(root: Path, folder: str, problems: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """({stem: image name}, {stem: caption name}) of one flat folder, names relative to root; an
    unsupported file or a second image with the same stem is a problem line."""
    images: dict[str, str] = {}
    captions: dict[str, str] = {}
    try:
        files = sorted(e.name for e in os.scandir(root / folder) if not e.name.startswith("."))
    except OSError as exc:
        problems.append(f"{folder}/: cannot list ({exc.strerror or exc})")
        return images, captions
    for file in files:
        name, (stem, suffix) = posixpath.join(folder, file), os.path.splitext(file)
        if suffix.lower() == ".txt":
            captions[stem] = name
        elif suffix.lower() not in IMAGE_SUFFIXES:
            problems.append(f"{printable(name)}: unsupported format (expected .jpg, .jpeg, .png or .webp)")
        elif stem in images:
            problems.append(f"{printable(name)}: a second image named {printable(stem)}; skipped")
        else:
            images[stem] = name
    return images, captions


def _scan_pair_folders(root: Path, problems: list[str]) -> list[ImageRecord]:
    inside = _Inside(root)
    controls, _ = _images_by_stem(root, CONTROL_DIR, problems)
    targets, captions = _images_by_stem(root, TARGET_DIR, problems)
    records: list[ImageRecord] = []
    for stem, name in targets.items():
        control = controls.get(stem)
        caption_name = captions.get(stem)
        if control is None:
            problems.append(
                f"{printable(name)}: no control image (no {CONTROL_DIR}/{printable(stem)}.jpg/.png)"
            )
            continue
        if caption_name is None:
            problems.append(f"{printable(name)}: no prompt (no {TARGET_DIR}/{printable(stem)}.txt)")
            continue
        why = inside.problem(name) or inside.problem(control) or inside.problem(caption_name)
        caption = ""
        if not why:
            try:
                caption = _read_caption(root / caption_name)
            except (OSError, ValueError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if why or not caption:
            problems.append(f"{printable(name)}: {why or f'empty prompt in {printable(caption_name)}'}")
            continue
        records.append(EditPair(root / name, name, caption, root / control, control))
    for stem, control in controls.items():
        if stem not in targets:
            problems.append(
                f"{printable(control)}: no target image (no {TARGET_DIR}/{printable(stem)}.png/.jpg)"
            )
    for stem, caption_name in captions.items():
        if stem not in targets:
            problems.append(f"{printable(caption_name)}: prompt file without a target image")
    return records


def _jsonl_has_controls(root: Path) -> bool:
    path = root / "metadata.jsonl"
    if not path.is_file():
        return False
    try:
        with open_regular(path, inside=root) as handle:
            for number, raw in enumerate(_lines(handle)):
                if number >= _PEEK_LINES:
                    break
                try:
                    record = json.loads(raw or b"null")
                except (ValueError, RecursionError):
                    continue
                if isinstance(record, dict) and CONTROL_KEY in record:
                    return True
    except (OutsideFileError, OSError):
        return False  # scan_folder names it
    return False


class _PairReader(_MetadataReader):
    """metadata.jsonl records with a control path: each resolved and checked as the target's is."""

    def add_record(self, where: str, record: Any) -> None:
        if not isinstance(record, dict):
            super().add_record(where, record)  # its line: expected an object
            return
        raw = record.get(CONTROL_KEY)
        control, why = self._resolve(raw) if isinstance(raw, str) else (None, None)
        if control is None:
            target = _pick(record, PATH_KEYS) if isinstance(record, dict) else None
            if target and isinstance(target[1], str):
                self._resolve(target[1])  # named here: not reported again as missing from the file
            if why is None:
                self.problems.append(f"{where}: {CONTROL_KEY}: expected the control image's path (a string)")
            else:
                self.problems.append(f"{where} ({printable(str(raw)[:_SHOWN])}): control image: {why}")
            return
        before = set(self.records)
        super().add_record(where, record)
        for name in set(self.records) - before:
            plain = self.records[name]
            self.records[name] = EditPair(plain.path, name, plain.caption, self.root / control, control)


def _scan_pair_jsonl(root: Path, problems: list[str]) -> list[ImageRecord]:
    return _scan_metadata(root, "metadata.jsonl", problems, _PairReader)


def record_files(record: ImageRecord) -> tuple[Path, ...]:
    """The files whose bytes make a record's content digest."""
    return (record.path, record.control) if isinstance(record, EditPair) else (record.path,)


def load_pixels(record: ImageRecord, resolution: int, inside: Path) -> np.ndarray:
    """[3, H, W] in [-1, 1]; an edit pair's [2, 3, H, W]: target, then control, both resolution square."""
    target = to_pixels(load_image(record.path, resolution, inside))
    if not isinstance(record, EditPair):
        return target
    return np.stack([target, to_pixels(load_image(record.control, resolution, inside))])


def split_pixels(pixels: Any) -> tuple[Any, Any]:
    """A batch of load_pixels results -> (targets [B, 3, H, W], controls [B, 3, H, W] or None)."""
    return (pixels[:, 0], pixels[:, 1]) if pixels.dim() == 5 else (pixels, None)
