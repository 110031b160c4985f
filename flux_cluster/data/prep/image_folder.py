"""A user's folder of captioned images, read as it is (issue 14: fine-tune FLUX on your own images).

Three layouts, detected from what the folder holds:

- ``metadata.json`` (seed 000's): images, usually in ``imgs/``, and a JSON list of records (an image path
  and a caption) or a mapping of file name to caption; paths are relative to the folder or to ``imgs/``.
- ``metadata.jsonl`` (Hugging Face imagefolder): images, possibly in subfolders, and one JSON record a
  line with ``file_name`` and ``text``, relative to the folder.
- ``captions.txt`` (kohya, ai-toolkit, SimpleTuner): ``name.jpg`` next to ``name.txt``.

Scanning lists files and never decodes an image (folders are large); a file that cannot be decoded shows
up in ``load_image``. Every item that cannot be used is one line in ``FolderScan.problems`` (or, strict,
the error), naming its path and why.
"""

import errno
import json
import os
import posixpath
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from PIL import Image, ImageOps

from flux_cluster.errors import FluxClusterError
from flux_cluster.outside import OutsideFileError, open_regular
from flux_cluster.safe_text import printable

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
# Image files we recognise but cannot read: a caption next to one is reported as such, not as orphaned.
_OTHER_IMAGE_SUFFIXES = (".gif", ".bmp", ".tif", ".tiff", ".heic", ".heif", ".avif", ".jxl")
# MPO is how Pillow names the multi-picture JPEGs many phone cameras write.
_FORMATS = frozenset({"JPEG", "MPO", "PNG", "WEBP"})
PATH_KEYS = ("file_name", "image", "img", "path")
CAPTION_KEYS = ("text", "caption", "prompt")
LAYOUTS = ("metadata.json", "metadata.jsonl", "captions.txt")
_MAX_CAPTION_BYTES = 64 * 1024
_MAX_LINE_BYTES = 1024 * 1024
_SKIPPED_DIRS = frozenset({"__MACOSX"})


class ImageFolderError(FluxClusterError):
    """The folder, or one image in it, cannot be used; the message is one line naming the path."""


@dataclass(frozen=True)
class ImageRecord:
    path: Path
    name: str
    """The path relative to the folder, POSIX: the stable identity of the sample."""
    caption: str


@dataclass
class FolderScan:
    root: Path
    layout: str
    """One of LAYOUTS."""
    records: list[ImageRecord] = field(default_factory=list)
    """Sorted by name."""
    problems: list[str] = field(default_factory=list)
    """One line per skipped item, naming its path and why."""


def _suffix(name: str) -> str:
    return os.path.splitext(name)[1].lower()


def _file_problem(path: Path, real_root: Path) -> str | None:
    """Why path cannot be read as a file of the folder, or None."""
    if not path.exists():
        return "a broken symlink" if path.is_symlink() else "no such file"
    real = path.resolve()
    if not real.is_relative_to(real_root):
        return "a symlink out of the folder"
    if not real.is_file():
        return "not a file"
    return None


class _Inside:
    """Whether a name relative to the folder is a file really inside it, symlinks followed. Folders are
    resolved once each: resolving every file's full path costs more than the rest of a scan."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.real_root = root.resolve()
        self._folders: dict[str, bool] = {}

    def problem(self, name: str) -> str | None:
        path = os.path.join(self.root, name)
        try:
            mode = os.lstat(path).st_mode
        except OSError as exc:
            return "no such file" if exc.errno in (errno.ENOENT, errno.ENOTDIR) else exc.strerror or str(exc)
        except ValueError:  # a NUL in the name
            return "not a valid file name"
        folder = posixpath.dirname(name)
        if folder not in self._folders:
            real = Path(os.path.realpath(os.path.join(self.root, folder)))
            self._folders[folder] = real.is_relative_to(self.real_root)
        if stat.S_ISLNK(mode) or not self._folders[folder]:
            return _file_problem(Path(path), self.real_root)
        return None if stat.S_ISREG(mode) else "not a file"


def _walk(root: Path, problems: list[str]) -> Iterator[tuple[str, list[str]]]:
    """(folder relative to root in POSIX, "" for root; its file names, sorted) for every folder.

    Hidden entries (.git, editors' and macOS's ._ files) are skipped. A symlinked folder is not entered:
    one inside the folder is walked under its real path, one leading out is a problem.
    """
    real_root = root.resolve()
    stack = [""]
    while stack:
        rel = stack.pop()
        files: list[str] = []
        subdirs: list[str] = []
        try:
            with os.scandir(root / rel) as entries:
                for entry in entries:
                    if entry.name.startswith(".") or entry.name in _SKIPPED_DIRS:
                        continue
                    child = posixpath.join(rel, entry.name)
                    if entry.is_dir(follow_symlinks=True):
                        if not entry.is_symlink():
                            subdirs.append(child)
                        elif not Path(entry.path).resolve().is_relative_to(real_root):
                            problems.append(f"{printable(child)}/: a symlink out of the folder; skipped")
                    else:
                        files.append(entry.name)
        except OSError as exc:
            problems.append(f"{printable(rel or '.')}/: cannot list ({exc.strerror or exc})")
            continue
        yield rel, sorted(files)
        stack.extend(sorted(subdirs, reverse=True))


def _read_caption(path: Path) -> str:
    """The caption file's text, stripped; raises ValueError with the reason when unusable."""
    with path.open("rb") as handle:
        raw = handle.read(_MAX_CAPTION_BYTES + 1)
    if len(raw) > _MAX_CAPTION_BYTES:
        raise ValueError(f"longer than {_MAX_CAPTION_BYTES} bytes; expected a caption")
    try:
        return raw.decode("utf-8-sig").strip()
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None


def _scan_captions(root: Path, problems: list[str]) -> tuple[list[ImageRecord], bool]:
    """The name.jpg + name.txt layout; also whether any image had a caption file (the layout's mark)."""
    inside = _Inside(root)
    records: list[ImageRecord] = []
    paired = False
    for rel, files in _walk(root, problems):
        captions = {os.path.splitext(f)[0]: f for f in files if _suffix(f) == ".txt"}
        used: set[str] = set()
        others = {os.path.splitext(f)[0]: f for f in files if _suffix(f) in _OTHER_IMAGE_SUFFIXES}
        for file in files:
            if _suffix(file) not in IMAGE_SUFFIXES:
                continue
            name = posixpath.join(rel, file)
            stem = os.path.splitext(file)[0]
            caption_file = captions.get(stem)
            if caption_file is None:
                problems.append(f"{printable(name)}: no caption (no {printable(stem)}.txt next to it)")
                continue
            paired = True
            used.add(stem)
            caption_name = posixpath.join(rel, caption_file)
            why = inside.problem(name)
            if why:
                problems.append(f"{printable(name)}: {why}")
                continue
            why = inside.problem(caption_name)
            try:
                caption = "" if why else _read_caption(root / caption_name)
            except (OSError, ValueError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            if why:
                problems.append(f"{printable(caption_name)}: {why}")
            elif not caption:
                problems.append(f"{printable(name)}: empty caption in {printable(caption_name)}")
            else:
                records.append(ImageRecord(root / name, name, caption))
        for stem, caption_file in captions.items():
            if stem in used:
                continue
            where = printable(posixpath.join(rel, caption_file))
            if stem in others:
                problems.append(
                    f"{where}: caption of {printable(others[stem])}, an unsupported format "
                    "(expected JPEG, PNG or WebP)"
                )
            else:
                problems.append(f"{where}: caption file without an image")
    return records, paired


def _pick(record: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    """The first of keys the record has, with its value."""
    for key in keys:
        if key in record:
            return key, record[key]
    return None


class _MetadataReader:
    """Turns metadata entries into records: resolves and checks each path, drops duplicates."""

    def __init__(self, root: Path, metadata: str, problems: list[str]) -> None:
        self.root = root
        self.inside = _Inside(root)
        # seed 000 writes paths relative to imgs/ as often as to the folder.
        self.bases = ("", "imgs") if metadata == "metadata.json" else ("",)
        self.problems = problems
        self.records: dict[str, ImageRecord] = {}
        self.mentioned: set[str] = set()
        """Every existing image some entry names, usable or not: the others have no caption."""

    def _resolve(self, raw: str) -> tuple[str | None, str | None]:
        """(name relative to the folder, None) or (None, why the path cannot be used)."""
        if not raw.strip():
            return None, "an empty image path"
        if raw.startswith(("/", "\\")) or raw[1:3] in (":/", ":\\"):
            return None, "an absolute path; expected one relative to the folder"
        norm = posixpath.normpath(raw)
        if norm == ".." or norm.startswith("../"):
            return None, "escapes the folder; expected a path inside it"
        names = [posixpath.normpath(posixpath.join(base, norm)) for base in self.bases]
        name = next((n for n in names if os.path.lexists(os.path.join(self.root, n))), names[0])
        why = self.inside.problem(name)
        if why:
            return None, why
        self.mentioned.add(name)
        if _suffix(name) not in IMAGE_SUFFIXES:
            return None, "unsupported format (expected .jpg, .jpeg, .png or .webp)"
        return name, None

    def add(self, where: str, raw_path: Any, caption: tuple[str, Any] | None) -> None:
        """One entry: where names it in the metadata file (line, index or key); caption is (what holds
        it, its value), None when the entry has none."""
        if not isinstance(raw_path, str):
            self.problems.append(f"{where}: image path: expected a string, got {type(raw_path).__name__}")
            return
        label = f"{where} ({printable(raw_path[:200])})"  # a metadata line may be a megabyte
        name, why = self._resolve(raw_path)
        if name is None:
            self.problems.append(f"{label}: {why}")
            return
        if caption is None:
            self.problems.append(f"{label}: no caption (expected one of the keys {', '.join(CAPTION_KEYS)})")
            return
        holder, text = caption
        if not isinstance(text, str):
            self.problems.append(f"{label}: {holder}: expected a caption string, got {type(text).__name__}")
            return
        if not text.strip():
            self.problems.append(f"{label}: empty caption")
            return
        if name in self.records:
            self.problems.append(f"{label}: duplicate of an earlier entry for {printable(name)}; skipped")
            return
        self.records[name] = ImageRecord(self.root / name, name, text.strip())

    def add_record(self, where: str, record: Any) -> None:
        if not isinstance(record, dict):
            got = type(record).__name__
            self.problems.append(f"{where}: expected an object with an image path and a caption, got {got}")
            return
        path = _pick(record, PATH_KEYS)
        if path is None:
            self.problems.append(f"{where}: no image path (expected one of the keys {', '.join(PATH_KEYS)})")
            return
        caption = _pick(record, CAPTION_KEYS)
        self.add(where, path[1], (f"key {caption[0]!r}", caption[1]) if caption else None)


MAX_METADATA_JSON_BYTES = 256 << 20
"""metadata.json is read whole: a caption list of millions of images fits; more is refused (use .jsonl)."""


def _json_problem(exc: Exception, position: bool = True) -> str:
    """Why text is not usable JSON: its first error's place, or nesting/number limits (never raised on)."""
    if isinstance(exc, json.JSONDecodeError):
        where = f"line {exc.lineno} column {exc.colno}" if position else f"column {exc.colno}"
        return f"not valid JSON ({where}: {exc.msg})"
    if isinstance(exc, RecursionError):
        return "JSON nested too deeply; refused"
    return f"not valid JSON ({printable((str(exc).splitlines() or [type(exc).__name__])[0])})"


def _read_json(reader: _MetadataReader, path: Path) -> None:
    try:
        with open_regular(path, inside=reader.root) as handle:  # checked as opened: no FIFO or link
            raw = handle.read(MAX_METADATA_JSON_BYTES + 1)
        if len(raw) > MAX_METADATA_JSON_BYTES:
            reader.problems.append(
                f"metadata.json: over {MAX_METADATA_JSON_BYTES >> 20} MiB; use metadata.jsonl for that many"
            )
            return
        data = json.loads(raw.decode("utf-8-sig"))
    except OutsideFileError:
        reader.problems.append("metadata.json: not a regular file in the folder")
        return
    except OSError as exc:
        reader.problems.append(f"metadata.json: cannot read ({exc.strerror or exc})")
        return
    except UnicodeDecodeError:
        reader.problems.append("metadata.json: not UTF-8 text")
        return
    except (RecursionError, ValueError) as exc:  # JSONDecodeError, too deep, a 4,300+-digit number
        reader.problems.append(f"metadata.json: {_json_problem(exc)}")
        return
    if isinstance(data, list):
        for index, record in enumerate(data):
            reader.add_record(f"metadata.json[{index}]", record)
    elif isinstance(data, dict):
        for key, caption in data.items():
            reader.add("metadata.json", key, ("its value", caption))
    else:
        reader.problems.append(
            "metadata.json: expected a list of records or a mapping of file name to caption, "
            f"got {type(data).__name__}"
        )


def _lines(handle: BinaryIO) -> Iterator[bytes | None]:
    """The file's lines, each at most _MAX_LINE_BYTES (None stands for a longer one, skipped unread)."""
    while raw := handle.readline(_MAX_LINE_BYTES + 1):
        if len(raw) > _MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = handle.readline(_MAX_LINE_BYTES)
            yield None
        else:
            yield raw


def _read_jsonl(reader: _MetadataReader, path: Path) -> None:
    try:  # checked as opened: /dev/zero or a FIFO would never end
        with open_regular(path, inside=reader.root) as handle:
            for number, raw in enumerate(_lines(handle), start=1):
                _add_jsonl_line(reader, f"metadata.jsonl line {number}", raw)
    except OutsideFileError:
        reader.problems.append("metadata.jsonl: not a regular file in the folder")


def _add_jsonl_line(reader: _MetadataReader, where: str, raw: bytes | None) -> None:
    if raw is None:
        reader.problems.append(f"{where}: longer than {_MAX_LINE_BYTES} bytes; expected one record")
        return
    try:
        text = raw.decode("utf-8-sig").strip()
        if text:
            reader.add_record(where, json.loads(text))
    except UnicodeDecodeError:
        reader.problems.append(f"{where}: not UTF-8 text")
    except (RecursionError, ValueError) as exc:
        reader.problems.append(f"{where}: {_json_problem(exc, position=False)}")


def _scan_metadata(
    root: Path, layout: str, problems: list[str], reader_type: type[_MetadataReader] = _MetadataReader
) -> list[ImageRecord]:
    reader = reader_type(root, layout, problems)
    (_read_json if layout == "metadata.json" else _read_jsonl)(reader, root / layout)
    for rel, files in _walk(root, problems):
        for file in files:
            name = posixpath.join(rel, file)
            if _suffix(file) in IMAGE_SUFFIXES and name not in reader.mentioned:
                problems.append(f"{printable(name)}: no caption (not in {layout})")
    return list(reader.records.values())


def _no_layout(root: Path) -> ImageFolderError:
    return ImageFolderError(
        f"{printable(str(root))}: no captioned images found; expected metadata.json (with imgs/), "
        "metadata.jsonl (Hugging Face imagefolder) or name.txt captions next to name.jpg/.png/.webp"
    )


def scan_folder(root: Path, *, strict: bool = False) -> FolderScan:
    """The folder's layout, its usable images in name order and a line for every item skipped.

    strict: any skipped item is an error naming the first. No usable image is always an error.
    """
    root = Path(root)
    shown = printable(str(root))
    if not root.exists():
        raise ImageFolderError(f"{shown}: no such folder; expected a folder of captioned images")
    if not root.is_dir():
        raise ImageFolderError(f"{shown}: not a folder; expected a folder of captioned images")
    has = [name for name in ("metadata.json", "metadata.jsonl") if os.path.lexists(root / name)]
    if len(has) == 2:
        raise ImageFolderError(
            f"{shown}: both metadata.json and metadata.jsonl; expected one (remove the other)"
        )
    problems: list[str] = []
    if has:
        layout = has[0]
        records = _scan_metadata(root, layout, problems)
    else:
        layout = "captions.txt"
        records, paired = _scan_captions(root, problems)
        if not paired:
            raise _no_layout(root)
    return finish_scan(root, layout, records, problems, strict)


def finish_scan(
    root: Path, layout: str, records: list[ImageRecord], problems: list[str], strict: bool
) -> FolderScan:
    """The scan's result; strict: any skipped item is an error naming the first. No record is an error."""
    shown = printable(str(root))
    if strict and problems:
        more = f" ({len(problems)} problems in all)" if len(problems) > 1 else ""
        raise ImageFolderError(f"{shown}: {problems[0]}{more}; strict: expected every item usable")
    if not records:
        first = f"; first of {len(problems)} skipped: {problems[0]}" if problems else ""
        raise ImageFolderError(f"{shown}: no usable images ({layout} layout){first}")
    records.sort(key=lambda record: record.name)
    return FolderScan(root=root, layout=layout, records=records, problems=problems)


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB: transparency composited on white, grayscale and CMYK converted."""
    if image.mode in ("I", "I;16", "I;16L", "I;16B", "I;16N"):
        # 16-bit grayscale PNG: Pillow's convert clips to 255 (all white); keep the top 8 bits instead.
        # (No int64 copy: that alone was 8 bytes a pixel.)
        values = np.asarray(image)
        if values.dtype != np.uint16:
            values = np.clip(values, 0, 65535)
        image = Image.fromarray((values >> 8).astype(np.uint8))
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


MAX_DECODE_PIXELS = 40_000_000
"""Pixels an image may decode to (after JPEG's reduced decoding): about 1 GB at the worst (see below), and
PNG/WebP have no reduced decoding. A 9400 x 9400 PNG of a few hundred KB would take ~2 GB; it is refused
from its header, before any decoding."""
DECODE_BYTES_PER_PIXEL = 24
"""Memory one decode may take per pixel at its peak: a 16-bit or RGBA file decoded (up to 4 bytes), its
RGBA copy, the white background and the composite (4 each), the RGB result (3), the resize's copy."""
MAX_DECODE_BYTES = MAX_DECODE_PIXELS * DECODE_BYTES_PER_PIXEL
"""What one decoding thread may need at most: the encoder sizes its thread pool by it."""
MAX_ASPECT = 16
"""Longer side / shorter side beyond which an image is refused: its square crop would be a sliver, and a
1 x 60,000 strip resized to a short side of 512 would need tens of GB."""


def _square(image: Image.Image, resolution: int) -> Image.Image:
    """Resized so the short side is resolution, then the centre resolution x resolution."""
    width, height = image.size
    if (width, height) != (resolution, resolution):
        scale = resolution / min(width, height)
        size = (max(resolution, round(width * scale)), max(resolution, round(height * scale)))
        image = image.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
    left = (image.width - resolution) // 2
    top = (image.height - resolution) // 2
    return image.crop((left, top, left + resolution, top + resolution))


def load_image(path: Path, resolution: int, inside: Path | None = None) -> Image.Image:
    """The image as RGB, upright (EXIF orientation), resolution x resolution (short side resized, then
    centre-cropped). Raises ImageFolderError naming path for a file that cannot be used.

    The file is opened once, without following a final symlink, and must be a regular file (inside the
    folder ``inside`` when given, checked on the opened file): a path swapped for a symlink out of the
    folder after the scan is refused, not read. Symlinks inside the folder are resolved first."""
    shown = printable(str(path))
    if resolution < 1:
        raise ImageFolderError(f"resolution {resolution}: expected a positive number of pixels")
    real = Path(os.path.realpath(path))
    try:
        with open_regular(real, inside) as handle, Image.open(handle) as image:
            if image.format not in _FORMATS:
                raise ImageFolderError(f"{shown}: a {image.format} image; expected JPEG, PNG or WebP")
            limit = Image.MAX_IMAGE_PIXELS
            if limit and image.width * image.height > limit:
                raise ImageFolderError(
                    f"{shown}: {image.width}x{image.height} pixels, over Pillow's decompression-bomb "
                    f"limit of {limit}"
                )
            if max(image.size) > MAX_ASPECT * min(image.size):
                raise ImageFolderError(
                    f"{shown}: {image.width}x{image.height} pixels, more than {MAX_ASPECT}:1; expected a "
                    "picture, not a strip"
                )
            image.draft(None, (resolution, resolution))  # JPEG: decode at 1/2..1/8 when still large enough
            if image.width * image.height > MAX_DECODE_PIXELS:  # the size it decodes to, from the header
                raise ImageFolderError(
                    f"{shown}: {image.width}x{image.height} pixels to decode, over the {MAX_DECODE_PIXELS:,} "
                    "an image may have here; expected a picture of at most about 40 megapixels (or a JPEG)"
                )
            upright = ImageOps.exif_transpose(image)
            rgb = _to_rgb(upright)
    except ImageFolderError:
        raise
    except OutsideFileError as exc:
        reason = str(exc).removeprefix(f"{real}: ")
        raise ImageFolderError(f"{shown}: {printable(reason)}") from None
    except Image.DecompressionBombError as exc:
        raise ImageFolderError(f"{shown}: {exc}") from None
    except FileNotFoundError:
        raise ImageFolderError(f"{shown}: no such file") from None
    except Exception as exc:
        # A decoder fed a broken file raises almost anything (OSError, SyntaxError, ValueError,
        # struct.error...): all of them mean this file cannot be used.
        reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc).strip()
        reason = printable(reason.splitlines()[0] if reason else type(exc).__name__)
        raise ImageFolderError(f"{shown}: cannot decode the image ({reason})") from None
    return _square(rgb, resolution)


def to_pixels(image: Image.Image) -> np.ndarray:
    """float32 [3, H, W] in [-1, 1], from an RGB image (what load_image returns)."""
    if image.mode != "RGB":
        raise ValueError(f"to_pixels expects an RGB image, got mode {image.mode}")
    array = np.asarray(image, dtype=np.float32).transpose(2, 0, 1)
    return np.ascontiguousarray(array / np.float32(127.5) - np.float32(1.0))
