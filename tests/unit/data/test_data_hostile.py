"""data encode against hostile or broken input: files swapped for symlinks after the scan, images whose
header promises gigabytes of pixels, JSON nested past the recursion limit or with 5000-digit numbers (in
an image folder's metadata, a pipeline's configs), a broken image drawn for val, the skip list of a
cached encode, and the progress bar left on screen beside its summary line."""

import dataclasses
import io
import json
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from data_helpers import write_image_folder
from PIL import Image
from rich.console import Console

from flux_cluster.data.prep.encode import EncodeOptions, Encoding, decode_threads, split_items
from flux_cluster.data.prep.image_folder import MAX_DECODE_BYTES, ImageFolderError, load_image, scan_folder
from flux_cluster.data.prep.progress import StageProgress
from flux_cluster.errors import FluxClusterError

DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "9" * 5000


def _options(images: Path, model: Path | None = None, **more: object) -> EncodeOptions:
    return EncodeOptions(images=images, output=images.parent / "out", model=model or images, **more)  # type: ignore[arg-type]


# ---- time of check, time of use


def test_images_swapped_for_symlinks_after_the_scan_are_skipped_not_read(tmp_path: Path) -> None:
    write_image_folder(root := tmp_path / "images", "captions.txt", 6, size=(16, 16))
    Image.new("RGB", (16, 16), (1, 2, 3)).save(secret := tmp_path / "secret.png")
    scan = scan_folder(root, strict=True)
    swapped = scan.records[:2]
    for record in swapped:  # after the scan, before the encode
        record.path.unlink()
        record.path.symlink_to(secret)
    problems: list[str] = []
    items = split_items(scan.records, _options(root, resolution=16), problems)
    assert {i.record.name for i in items} == {r.name for r in scan.records[2:]}
    assert len(problems) == 2 and all("outside" in line and "\n" not in line for line in problems), problems
    assert all(any(r.name in line for line in problems) for r in swapped)
    # Swapped after the digests, before the decode: the decode refuses it too.
    later = items[0].record.path
    later.unlink()
    later.symlink_to(secret)
    with pytest.raises(ImageFolderError, match=rf"{re.escape(later.name)}: outside .*; refused"):
        load_image(later, 16, root)
    # A symlink that stays inside the folder still reads.
    inside = items[1].record.path
    inside.unlink()
    inside.symlink_to(items[2].record.path)
    assert load_image(inside, 16, root).size == (16, 16)


# ---- decoded memory


def _png(path: Path, size: int, depth: int, colour: int, bytes_per_pixel: int, rows: bool = True) -> Path:
    """A PNG of size x size zero pixels written without holding them: a few hundred KB on disk for
    gigabytes decoded (rows=False: the header alone, no pixel data)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    parts = []
    if rows:
        packer = zlib.compressobj(1)
        block = bytes((1 + size * bytes_per_pixel) * 100)
        parts = [packer.compress(block) for _ in range(size // 100)] + [packer.flush()]
    header = struct.pack(">IIBBBBB", size, size, depth, colour, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b"")
    )
    return path


PEAK = """
import resource, sys
from pathlib import Path
from flux_cluster.data.prep.image_folder import ImageFolderError, load_image
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    load_image(Path(sys.argv[1]), 512)
    print("decoded")
except ImageFolderError as exc:
    print(exc)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_a_9400_pixel_square_16_bit_png_is_refused_from_its_header_with_memory_flat(tmp_path: Path) -> None:
    image = _png(tmp_path / "huge16.png", 9400, depth=16, colour=0, bytes_per_pixel=2)
    assert image.stat().st_size < 1 << 20  # under 1 MB on disk, 177 MB of pixels, ~2 GB to convert
    done = subprocess.run(
        [sys.executable, "-c", PEAK, str(image)], capture_output=True, text=True, timeout=60, check=True
    )
    line, grown_mb = done.stdout.strip().splitlines()
    assert "huge16.png: 9400x9400 pixels to decode, over the 40,000,000" in line, line
    assert int(grown_mb) < 64, f"peak memory grew by {grown_mb} MB"


def test_an_rgba_png_too_large_to_decode_is_one_line_and_a_jpeg_decodes_reduced(tmp_path: Path) -> None:
    header_only = _png(tmp_path / "rgba.png", 9400, depth=8, colour=6, bytes_per_pixel=4, rows=False)
    with pytest.raises(ImageFolderError, match=r"rgba\.png: 9400x9400 pixels to decode, over") as refused:
        load_image(header_only, 512)
    assert "\n" not in str(refused.value)
    # A JPEG as large decodes at 1/8 (draft): not refused. (8000 x 6000 = 48 MP, over the cap at full size.)
    Image.new("RGB", (8000, 6000), (10, 20, 30)).save(big := tmp_path / "big.jpg", quality=50)
    assert load_image(big, 512).size == (512, 512)


def test_decode_threads_are_sized_by_memory_as_well_as_cores() -> None:
    assert decode_threads(cpus=16, available=1 << 40) == 8
    assert decode_threads(cpus=2, available=1 << 40) == 2
    assert decode_threads(cpus=16, available=4 * MAX_DECODE_BYTES) == 2  # half the memory, 2 worst cases
    assert decode_threads(cpus=16, available=MAX_DECODE_BYTES // 4) == 1  # always one
    assert 1 <= decode_threads() <= 8


# ---- a broken image drawn for val


def test_a_broken_image_drawn_for_val_is_skipped_by_name_and_another_takes_its_place(tmp_path: Path) -> None:
    write_image_folder(root := tmp_path / "images", "captions.txt", 5, size=(16, 16))
    records = scan_folder(root).records
    options = _options(root, resolution=16, val_fraction=0.2)
    (first,) = [i.record for i in split_items(records, options) if i.split == "val"]
    first.path.write_bytes(first.path.read_bytes()[:40])  # truncated
    problems: list[str] = []
    items = split_items(records, options, problems)
    val = [i.record.name for i in items if i.split == "val"]
    assert (
        len(val) == 1
        and val != [first.name]
        and len(items) == 4
        and first.name not in {i.record.name for i in items}
    )
    (line,) = problems
    assert f"{first.path}: cannot decode the image" in line and "\n" not in line
    with pytest.raises(ImageFolderError, match=rf"{re.escape(first.name)}: cannot decode.*; strict"):
        split_items(records, _options(root, resolution=16, val_fraction=0.2, strict=True))
    # Every image broken: each val candidate is skipped until one more would leave no train image.
    for record in records:
        record.path.write_bytes(b"broken")
    with pytest.raises(FluxClusterError, match="1 usable image"):
        split_items(records, options, [])


# ---- JSON past the parser's limits


@pytest.mark.parametrize(
    "text", [DEEP, '[{"file_name": "a.png", "text": ' + HUGE + "}]"], ids=["deep", "huge"]
)
def test_metadata_json_too_deep_or_with_a_huge_number_is_one_line(tmp_path: Path, text: str) -> None:
    write_image_folder(tmp_path, "metadata.json", 2)
    (tmp_path / "metadata.json").write_text(text)
    with pytest.raises(ImageFolderError) as refused:
        scan_folder(tmp_path)
    assert "metadata.json: " in str(refused.value) and "\n" not in str(refused.value)
    assert ("nested too deeply" if text is DEEP else "not valid JSON") in str(refused.value)


def test_metadata_jsonl_lines_too_deep_or_with_huge_numbers_are_skipped_by_line(tmp_path: Path) -> None:
    write_image_folder(tmp_path, "metadata.jsonl", 2)
    with (tmp_path / "metadata.jsonl").open("a") as handle:
        handle.write(DEEP[:5000] + DEEP[-5000:] + "\n")
        handle.write('{"file_name": "x.png", "text": ' + HUGE + "}\n")
    scan = scan_folder(tmp_path)
    assert len(scan.records) == 2
    assert "metadata.jsonl line 3: JSON nested too deeply; refused" in scan.problems
    assert any(p.startswith("metadata.jsonl line 4: not valid JSON (") for p in scan.problems), scan.problems


def _fake_pipeline(root: Path) -> Path:
    """The configs a FLUX pipeline folder must hold for the checks and the fingerprint (no weights)."""
    from flux_cluster.data.prep.encoders import ENCODER_PARTS
    from flux_cluster.models.latents import LATENT_SCALE, LATENT_SHIFT

    for part in ENCODER_PARTS:
        (root / part).mkdir(parents=True)
    (root / "model_index.json").write_text(
        json.dumps({"transformer": ["diffusers", "FluxTransformer2DModel"]})
    )
    vae = {"latent_channels": 16, "shift_factor": LATENT_SHIFT, "scaling_factor": LATENT_SCALE}
    (root / "vae" / "config.json").write_text(json.dumps(vae))
    return root


@pytest.mark.parametrize("file", ["model_index.json", "vae/config.json"])
@pytest.mark.parametrize("text", [DEEP, '{"latent_channels": ' + HUGE + "}"], ids=["deep", "huge"])
def test_a_pipeline_config_too_deep_or_with_a_huge_number_is_one_line(
    tmp_path: Path, file: str, text: str
) -> None:
    from flux_cluster.data.prep.encoders import check_pipeline_dir
    from flux_cluster.evaluate.clip import _config
    from flux_cluster.evaluate.target import is_pipeline

    pipeline = _fake_pipeline(tmp_path / "flux")
    (pipeline / file).write_text(text)
    with pytest.raises(FluxClusterError) as refused:
        check_pipeline_dir(pipeline)
    assert f"{pipeline / file}: not readable JSON (" in str(refused.value) and "\n" not in str(refused.value)
    # evaluate's probes: not a pipeline / no config, never a traceback
    assert is_pipeline(pipeline) is (file != "model_index.json")
    assert _config(pipeline / "vae") == ({} if file == "vae/config.json" else _config(pipeline / "vae"))


def test_a_pipeline_config_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    import os

    from flux_cluster.data.prep.encoders import check_pipeline_dir
    from flux_cluster.evaluate.target import is_pipeline

    pipeline = _fake_pipeline(tmp_path / "flux")
    (pipeline / "model_index.json").unlink()
    os.mkfifo(pipeline / "model_index.json")
    assert is_pipeline(pipeline) is False
    (pipeline / "model_index.json").unlink()
    (pipeline / "model_index.json").symlink_to("/dev/zero")
    with pytest.raises(FluxClusterError, match=r"model_index\.json: "):
        check_pipeline_dir(pipeline)
    assert is_pipeline(pipeline) is False


# ---- the skip list of a cached encode


def test_a_rerun_over_the_cache_names_every_skipped_image_again_and_strict_refuses_it(tmp_path: Path) -> None:
    from flux_cluster.data.format import EMPTY_DIR

    write_image_folder(root := tmp_path / "images", "captions.txt", 6, size=(16, 16))
    options = _options(root, _fake_pipeline(tmp_path / "flux"), resolution=16, cache=tmp_path / "cache")
    encoding = Encoding(options, Console(file=io.StringIO()))
    # As a first run leaves the cache: every chunk written, one with an image its decode skipped.
    encoding.chunk_dir.mkdir(parents=True)
    for chunk in encoding.chunks:
        encoding.chunk_path(chunk).write_bytes(b"")
        encoding.skipped_path(chunk).write_text("[]\n")
    (encoding.folder / EMPTY_DIR).mkdir()
    line = f"{root / 'img_003.webp'}: cannot decode the image (broken data stream)"
    encoding.skipped_path(encoding.chunks[0]).write_text(json.dumps([line]) + "\n")

    out = io.StringIO()
    again = Encoding(options, Console(file=out, width=300))
    assert again.encode() == 0
    printed = out.getvalue()
    assert f"skipped {line}" in printed and "are in the cache" in printed, printed
    assert again.skipped() == [line]
    # --strict over that cache refuses the image as the first run would have (it exited 0 before).
    strict = Encoding(dataclasses.replace(options, strict=True), Console(file=io.StringIO()))
    with pytest.raises(ImageFolderError, match="strict: expected every image usable") as caught:
        strict.encode()
    assert str(caught.value).startswith(line)
    # A damaged skip list in the cache is no traceback.
    encoding.skipped_path(encoding.chunks[0]).write_text(DEEP)
    assert Encoding(options, Console(file=io.StringIO())).skipped() == []


# ---- the progress line, once


def _screen(raw: str) -> list[str]:
    """The lines a terminal shows after raw: CR, LF, erase line (ESC[2K) and cursor up (ESC[1A) obeyed,
    other escape sequences dropped."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+", raw):
        if token == "\n":
            row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        elif token == "\r":
            col = 0
        elif token == "\x1b[2K":
            lines[row] = ""
        elif token == "\x1b[1A":
            row = max(0, row - 1)
        elif not token.startswith("\x1b"):
            lines[row] = lines[row][:col] + token + lines[row][col + len(token) :]
            col += len(token)
    return [line.rstrip() for line in lines if line.strip()]


def test_a_finished_stage_shows_its_progress_once_on_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with StageProgress("encode", 3, console, unit="images") as progress:
        progress.advance(3, 3000)
    shown = _screen(out.getvalue())
    assert len(shown) == 1 and shown[0].startswith("encode: 3/3 images"), shown


def test_data_state_files_nested_too_deeply_are_refused_or_redone_not_a_traceback(tmp_path: Path) -> None:
    """The dataset's own state files are read back from disk too: a deeply nested one is one line (the
    conversion plan, the synthetic marker), or treated as damaged (a shard record: converted again)."""
    from flux_cluster.data.prep.convert import PLAN_FILE, ConversionPlan
    from flux_cluster.data.prep.shards import STATE_DIR, ShardRecord
    from flux_cluster.data.prep.synthetic import MARKER, read_marker
    from flux_cluster.data.prep.verify import ShardCheck, _check_payload

    (tmp_path / STATE_DIR / "train").mkdir(parents=True)
    (tmp_path / STATE_DIR / PLAN_FILE).write_text(DEEP)
    with pytest.raises(FluxClusterError, match="not a flux-cluster conversion plan"):
        ConversionPlan.load(tmp_path)
    ShardRecord.path(tmp_path, "train", 0).write_text(DEEP)
    assert ShardRecord.load(tmp_path, "train", 0) is None
    (tmp_path / MARKER).write_text(DEEP)
    with pytest.raises(FluxClusterError, match="not a flux-cluster data marker"):
        read_marker(tmp_path)
    check = ShardCheck("train", 0)
    _check_payload(DEEP.encode(), "json", "train", {}, check, "shard_000000.tar: member 0.json")
    assert len(check.problems) == 1 and "bad json" in check.problems[0]
