"""Reading a user's folder of captioned images (flux_cluster.data.prep.image_folder): the three layouts, the
items that cannot be used, and the pixels of each image. Small generated images, all in process."""

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from data_helpers import write_image_folder
from PIL import Image

from flux_cluster.data.prep.image_folder import ImageFolderError, load_image, scan_folder, to_pixels

RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)


def _png(
    path: Path, colour: tuple[int, ...] = RED, size: tuple[int, int] = (40, 30), mode: str = "RGB"
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, colour).save(path)
    return path


def _close(pixel: tuple[int, ...], expected: tuple[int, ...], tolerance: int = 12) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel, expected, strict=True))


@pytest.mark.parametrize("layout", ["metadata.json", "metadata.jsonl", "captions.txt"])
def test_each_layout_written_by_the_helper_is_read(tmp_path: Path, layout: str) -> None:
    names = write_image_folder(tmp_path / "folder", layout, 4)
    scan = scan_folder(tmp_path / "folder", strict=True)
    assert scan.layout == layout
    assert scan.problems == []
    assert [r.name for r in scan.records] == names
    assert [r.caption for r in scan.records] == [
        f"a {c} square {i}" for i, c in enumerate(["red", "green", "blue", "yellow"])
    ]
    for record in scan.records:
        assert record.path == tmp_path / "folder" / record.name
        assert load_image(record.path, 16).size == (16, 16)


def test_metadata_json_key_aliases_mapping_and_imgs_relative_paths(tmp_path: Path) -> None:
    for name in ("a.png", "b.PNG", "sub/c.webp"):
        _png(tmp_path / "imgs" / name)
    records = [
        {"image": "a.png", "caption": "  first  "},  # relative to imgs/
        {"img": "imgs/b.PNG", "prompt": "second"},  # relative to the folder
        {"path": "sub/c.webp", "text": "third"},
    ]
    (tmp_path / "metadata.json").write_text(json.dumps(records))
    scan = scan_folder(tmp_path)
    assert scan.layout == "metadata.json"
    assert [(r.name, r.caption) for r in scan.records] == [
        ("imgs/a.png", "first"),
        ("imgs/b.PNG", "second"),
        ("imgs/sub/c.webp", "third"),
    ]
    (tmp_path / "metadata.json").write_text(
        json.dumps({"a.png": "one", "b.PNG": "two", "sub/c.webp": "three"})
    )
    assert [r.caption for r in scan_folder(tmp_path, strict=True).records] == ["one", "two", "three"]


def test_metadata_jsonl_subfolders_and_captions_txt_nested(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    _png(hf / "train" / "x.jpg")
    _png(hf / "y.png")
    lines = ['{"file_name": "train/x.jpg", "text": "an x"}', "", '{"file_name": "y.png", "prompt": "a y"}']
    (hf / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    scan = scan_folder(hf, strict=True)
    assert (scan.layout, [(r.name, r.caption) for r in scan.records]) == (
        "metadata.jsonl",
        [("train/x.jpg", "an x"), ("y.png", "a y")],
    )

    kohya = tmp_path / "kohya"
    _png(kohya / "10_subject" / "Photo.JPEG")
    (kohya / "10_subject" / "Photo.txt").write_text("\ufeff  a photo, of it \n\n")
    _png(kohya / "b.webp")
    (kohya / "b.txt").write_text("b")
    (kohya / ".hidden").mkdir()
    _png(kohya / ".hidden" / "z.png")  # hidden folders (.git, caches) are not read
    scan = scan_folder(kohya, strict=True)
    assert (scan.layout, [(r.name, r.caption) for r in scan.records]) == (
        "captions.txt",
        [("10_subject/Photo.JPEG", "a photo, of it"), ("b.webp", "b")],
    )


def _good(root: Path) -> None:
    """One usable image, so each bad case is skipped rather than leaving the folder empty."""
    _png(root / "good.png")
    (root / "good.txt").write_text("a good one")


def _jsonl(root: Path, *lines: str) -> None:
    _png(root / "good.png")
    (root / "metadata.jsonl").write_text(
        '{"file_name": "good.png", "text": "a good one"}\n' + "\n".join(lines)
    )


def _outside_link(root: Path) -> None:
    _good(root)
    _png(root.parent / "outside.png")
    os.symlink(root.parent / "outside.png", root / "link.png")
    (root / "link.txt").write_text("from elsewhere")


def _outside_folder_link(root: Path) -> None:
    _good(root)
    _png(root.parent / "elsewhere" / "x.png")
    (root.parent / "elsewhere" / "x.txt").write_text("x")
    os.symlink(root.parent / "elsewhere", root / "linked")
    os.symlink(root, root / "loop")  # a link back into the folder: its files are read once, where they are


def _metadata_json(root: Path) -> None:
    _png(root / "imgs" / "good.png")
    _png(root / "imgs" / "other.png")
    (root / "metadata.json").write_text(json.dumps([{"file_name": "good.png", "text": "good"}]))


BAD_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "image without caption": (
        lambda r: (_good(r), _png(r / "sub" / "lonely.png")),
        "sub/lonely.png: no caption (no lonely.txt next to it)",
    ),
    "empty caption": (
        lambda r: (_good(r), _png(r / "e.jpg"), (r / "e.txt").write_text(" \n")),
        "e.jpg: empty caption in e.txt",
    ),
    "caption without image": (
        lambda r: (_good(r), (r / "orphan.txt").write_text("x")),
        "orphan.txt: caption file without an image",
    ),
    "caption of an unsupported format": (
        lambda r: (_good(r), _png(r / "anim.gif", mode="P", colour=1), (r / "anim.txt").write_text("x")),
        "anim.txt: caption of anim.gif, an unsupported format (expected JPEG, PNG or WebP)",
    ),
    "symlink out of the folder": (_outside_link, "link.png: a symlink out of the folder"),
    "symlinked folder out of the folder": (
        _outside_folder_link,
        "linked/: a symlink out of the folder; skipped",
    ),
    "missing file": (
        lambda r: _jsonl(r, '{"file_name": "gone.png", "text": "x"}'),
        "metadata.jsonl line 2 (gone.png): no such file",
    ),
    "bad JSON line": (
        lambda r: _jsonl(r, '{"file_name": "a.png", "text": '),
        "metadata.jsonl line 2: not valid JSON (column 31: Expecting value)",
    ),
    "caption not a string": (
        lambda r: _jsonl(r, '{"file_name": "good.png", "text": ["a", "b"]}'),
        "metadata.jsonl line 2 (good.png): key 'text': expected a caption string, got list",
    ),
    "record not an object": (
        lambda r: _jsonl(r, '["good.png", "x"]'),
        "metadata.jsonl line 2: expected an object with an image path and a caption, got list",
    ),
    "record without a path key": (
        lambda r: _jsonl(r, '{"filename": "good.png", "text": "x"}'),
        "metadata.jsonl line 2: no image path (expected one of the keys file_name, image, img, path)",
    ),
    "path escapes": (
        lambda r: (_png(r.parent / "x.png"), _jsonl(r, '{"file_name": "../x.png", "text": "x"}')),
        "metadata.jsonl line 2 (../x.png): escapes the folder; expected a path inside it",
    ),
    "absolute path": (
        lambda r: _jsonl(r, json.dumps({"file_name": str(r / "good.png"), "text": "x"})),
        "): an absolute path; expected one relative to the folder",
    ),
    "duplicate": (
        lambda r: _jsonl(r, '{"file_name": "./good.png", "text": "again"}'),
        "metadata.jsonl line 2 (./good.png): duplicate of an earlier entry for good.png; skipped",
    ),
    "image not in the metadata": (
        _metadata_json,
        "imgs/other.png: no caption (not in metadata.json)",
    ),
    "mapping value not a string": (
        lambda r: (
            _png(r / "good.png"),
            _png(r / "b.png"),
            (r / "metadata.json").write_text('{"good.png": "ok", "b.png": {"a": 1}}'),
        ),
        "metadata.json (b.png): its value: expected a caption string, got dict",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_item_is_one_problem_line_and_strict_refuses_it(tmp_path: Path, case: str) -> None:
    make, line = BAD_CASES[case]
    root = tmp_path / "folder"
    root.mkdir()
    make(root)
    scan = scan_folder(root)
    assert [r.name for r in scan.records] in (["good.png"], ["imgs/good.png"])
    assert len(scan.problems) == 1 and line in scan.problems[0], scan.problems
    with pytest.raises(ImageFolderError) as refused:
        scan_folder(root, strict=True)
    message = str(refused.value)
    assert message.startswith(f"{root}: ") and line in message and "\n" not in message


def test_no_usable_image_and_no_layout_are_one_line_errors(tmp_path: Path) -> None:
    _png(tmp_path / "plain" / "a.png")
    (tmp_path / "plain" / "README.txt").write_text("a text file next to no image is no caption layout")
    with pytest.raises(ImageFolderError) as none:
        scan_folder(tmp_path / "plain")
    message = str(none.value)
    assert message.startswith(f"{tmp_path / 'plain'}: no captioned images found; expected metadata.json")
    assert all(layout in message for layout in ("metadata.json", "metadata.jsonl", ".txt")), message

    (tmp_path / "plain" / "metadata.json").write_text("{not json")
    with pytest.raises(ImageFolderError) as empty:
        scan_folder(tmp_path / "plain")
    assert str(empty.value) == (
        f"{tmp_path / 'plain'}: no usable images (metadata.json layout); first of 2 skipped: "
        "metadata.json: not valid JSON (line 1 column 2: Expecting property name enclosed in double quotes)"
    )
    (tmp_path / "plain" / "metadata.json").write_text("3")
    with pytest.raises(ImageFolderError, match=r"metadata\.json: expected a list of records or a mapping"):
        scan_folder(tmp_path / "plain")
    (tmp_path / "plain" / "metadata.jsonl").write_text("")
    with pytest.raises(ImageFolderError, match=r"both metadata\.json and metadata\.jsonl; expected one"):
        scan_folder(tmp_path / "plain")
    with pytest.raises(ImageFolderError, match="missing: no such folder"):
        scan_folder(tmp_path / "missing")


def test_transparency_is_composited_on_white(tmp_path: Path) -> None:
    rgba = Image.new("RGBA", (40, 40), (255, 0, 0, 255))
    rgba.paste((0, 0, 255, 0), (0, 0, 20, 40))  # left half transparent blue
    rgba.save(tmp_path / "rgba.png")
    image = load_image(tmp_path / "rgba.png", 40)
    assert image.mode == "RGB"
    assert image.getpixel((5, 20)) == WHITE and image.getpixel((35, 20)) == RED

    palette = Image.new("P", (40, 40), 0)
    palette.putpalette([0, 255, 0, 9, 9, 9])
    palette.paste(1, (0, 0, 20, 40))
    palette.save(tmp_path / "palette.png", transparency=1)
    image = load_image(tmp_path / "palette.png", 40)
    assert image.getpixel((5, 20)) == WHITE and image.getpixel((35, 20)) == GREEN

    Image.new("LA", (40, 40), (0, 0)).save(tmp_path / "la.webp", lossless=True)
    assert load_image(tmp_path / "la.webp", 8).getpixel((4, 4)) == WHITE


def test_exif_orientation_turns_the_image_upright(tmp_path: Path) -> None:
    stored = Image.new("RGB", (40, 30), BLUE)
    stored.paste(RED, (0, 0, 20, 30))  # left half red as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # shown turned 90 degrees clockwise: the stored left half is the top
    stored.save(tmp_path / "turned.jpg", exif=exif.tobytes(), quality=95)
    image = load_image(tmp_path / "turned.jpg", 30)
    assert image.size == (30, 30)
    # Upright it is 30x40 (top half red) and the crop keeps rows 5..35; as stored the top right is blue.
    assert _close(image.getpixel((27, 2)), RED) and _close(image.getpixel((2, 27)), BLUE)


def test_grayscale_cmyk_webp_and_format_by_content(tmp_path: Path) -> None:
    _png(tmp_path / "gray.png", colour=100, mode="L")
    assert load_image(tmp_path / "gray.png", 8).getpixel((4, 4)) == (100, 100, 100)
    Image.new("I;16", (40, 30), 0x8000).save(tmp_path / "gray16.png")  # 16-bit: mid grey, not white
    assert load_image(tmp_path / "gray16.png", 8).getpixel((4, 4)) == (128, 128, 128)
    Image.new("CMYK", (40, 30), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg", quality=95)
    assert _close(load_image(tmp_path / "cmyk.jpg", 8).getpixel((4, 4)), RED)
    Image.new("RGB", (40, 30), GREEN).save(tmp_path / "green.webp", lossless=True)
    assert load_image(tmp_path / "green.webp", 8).getpixel((4, 4)) == GREEN
    Image.new("RGB", (40, 30), BLUE).save(tmp_path / "really_png.jpg", format="PNG")
    assert load_image(tmp_path / "really_png.jpg", 8).getpixel((4, 4)) == BLUE
    Image.new("RGB", (40, 30), BLUE).save(tmp_path / "really_gif.png", format="GIF")
    with pytest.raises(ImageFolderError, match=r"really_gif\.png: a GIF image; expected JPEG, PNG or WebP"):
        load_image(tmp_path / "really_gif.png", 8)


@pytest.mark.parametrize("size", [(90, 30), (30, 90)])
def test_short_side_resized_then_centre_cropped(tmp_path: Path, size: tuple[int, int]) -> None:
    image = Image.new("RGB", size)
    wide = size[0] > size[1]
    for colour, start in zip((RED, GREEN, BLUE), (0, 30, 60), strict=True):
        image.paste(colour, (start, 0, start + 30, 30) if wide else (0, start, 30, start + 30))
    image.save(tmp_path / "strip.png")
    square = load_image(tmp_path / "strip.png", 10)  # 90x30 -> 30x10, then the middle 10x10: green
    assert square.size == (10, 10)
    assert all(_close(square.getpixel(xy), GREEN, 2) for xy in ((2, 2), (5, 5), (7, 7), (2, 7), (7, 2)))
    pixels = to_pixels(square)
    assert pixels.dtype == np.float32 and pixels.shape == (3, 10, 10)
    assert np.allclose(pixels[:, 5, 5], [-1.0, 1.0, -1.0], atol=0.02)
    assert pixels.min() >= -1.0 and pixels.max() <= 1.0


def test_broken_files_raise_one_line_naming_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Image.new("RGB", (40, 30), RED).save(tmp_path / "whole.jpg")
    data = (tmp_path / "whole.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageFolderError) as truncated:
        load_image(tmp_path / "cut.jpg", 16)
    assert str(truncated.value).startswith(f"{tmp_path / 'cut.jpg'}: cannot decode the image (")
    assert "\n" not in str(truncated.value)
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(ImageFolderError, match=r"text\.png: cannot decode the image \(cannot identify"):
        load_image(tmp_path / "text.png", 16)
    with pytest.raises(ImageFolderError, match=r"gone\.png: no such file"):
        load_image(tmp_path / "gone.png", 16)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # PIL's limit, lowered to this small image
    with pytest.raises(ImageFolderError, match=r"whole\.jpg: 40x30 pixels, over Pillow's decompression-bomb"):
        load_image(tmp_path / "whole.jpg", 16)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)  # over twice the limit: Pillow refuses on open
    with pytest.raises(ImageFolderError, match=r"whole\.jpg: Image size \(1200 pixels\) exceeds limit"):
        load_image(tmp_path / "whole.jpg", 16)


def test_a_strip_image_and_unending_metadata_are_refused_not_read(tmp_path: Path) -> None:
    """A 1 x 600 strip would need a huge resize to a 512 short side; metadata that is /dev/zero or a FIFO
    would never end: each is one line."""
    Image.new("RGB", (1, 600), RED).save(tmp_path / "strip.png")
    with pytest.raises(ImageFolderError, match=r"strip.png: 1x600 pixels, more than 16:1"):
        load_image(tmp_path / "strip.png", 512)
    for name, make in (
        ("metadata.json", lambda p: p.symlink_to("/dev/zero")),
        ("metadata.jsonl", lambda p: os.mkfifo(p)),
    ):
        root = tmp_path / name
        write_image_folder(root / "x", "captions.txt", 1)  # an image the metadata would have to caption
        make(root / name)
        with pytest.raises(ImageFolderError) as refused:
            scan_folder(root, strict=True)
        assert f"{name}: not a regular file in the folder" in str(refused.value)


def test_demo_images_refuse_an_unknown_layout_before_writing(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from flux_cluster.cli import app

    result = CliRunner().invoke(app, ["data", "demo-images", str(tmp_path / "demo"), "--layout", "bogus"])
    assert result.exit_code == 2 and "--layout 'bogus': expected metadata.json" in result.output
    assert not (tmp_path / "demo").exists()
    result = CliRunner().invoke(app, ["data", "demo-images", str(tmp_path / "demo"), "--count", "3"])
    assert result.exit_code == 0 and len(scan_folder(tmp_path / "demo").records) == 3


def test_the_val_split_is_round_fraction_of_the_images_with_the_smallest_name_hashes(tmp_path: Path) -> None:
    """data encode's split (flux_cluster.data.prep.encode.split_items): exactly round(fraction x images),
    halves up, at least one and never every image; chosen by name, so the same images stay in val as the
    folder changes around them; the val timesteps 0..7 in turn."""
    from flux_cluster.data.prep.encode import EncodeOptions, split_items

    write_image_folder(tmp_path / "images", "captions.txt", 41, size=(8, 8))
    records = scan_folder(tmp_path / "images").records

    def val(chosen: list, fraction: float = 0.1) -> dict[str, int | None]:
        options = EncodeOptions(images=tmp_path, output=tmp_path, model=tmp_path, val_fraction=fraction)
        return {i.record.name: i.timestep for i in split_items(chosen, options) if i.split == "val"}

    assert [len(val(records[:n])) for n in (2, 8, 15, 25, 40, 41)] == [1, 1, 2, 3, 4, 4]
    assert len(val(records[:3], 0.5)) == 2 and len(val(records[:2], 0.5)) == 1
    assert sorted(val(records[:40]).values()) == [0, 1, 2, 3]
    # Dropping train images (4 of them: the count stays round(3.6) = 4) leaves val as it was; a 41st image
    # either stays out of val or takes the place of exactly one val image.
    kept = set(val(records[:40]))
    fewer = [r for r in records[:40] if r.name in kept or r.name >= "img_005"]
    assert len(fewer) == 36 and set(val(fewer)) == kept
    grown = set(val(records))
    assert len(grown - kept) == len(kept - grown) <= 1 and grown - kept <= {records[40].name}
