"""Edit-pair folders (seed 004's layout and a metadata.jsonl): pairs matched by name, every unusable item
one line naming it, --strict refusing, and both images of a pair loaded for encoding."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from flux_cluster.data.prep.demo_images import write_image_folder
from flux_cluster.data.prep.edit_pairs import (
    FOLDER_LAYOUT,
    JSONL_LAYOUT,
    EditPair,
    load_pixels,
    record_files,
    scan_images,
    split_pixels,
)
from flux_cluster.data.prep.image_folder import ImageFolderError


def _image(path: Path, colour: tuple[int, int, int] = (200, 30, 30)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (24, 20), colour).save(path)


def pair_folder(root: Path) -> Path:
    """Two good pairs (png and jpg controls) and one of each problem."""
    for stem, suffix in (("a", ".png"), ("b", ".jpg")):
        _image(root / "control_images" / f"{stem}{suffix}")
        _image(root / "training_images" / f"{stem}.png", (20, 20, 200))
        (root / "training_images" / f"{stem}.txt").write_text(f"make {stem} blue\n")
    _image(root / "control_images" / "lonely.jpg")  # no target
    _image(root / "training_images" / "orphan.png")  # no control
    (root / "training_images" / "orphan.txt").write_text("x")
    _image(root / "control_images" / "mute.png")
    _image(root / "training_images" / "mute.png")  # no prompt
    (root / "training_images" / "ghost.txt").write_text("a prompt without a target")
    (root / "control_images" / "notes.gif").write_bytes(b"GIF89a")
    return root


def test_pairs_are_matched_by_name_and_every_unusable_file_is_one_line(tmp_path: Path) -> None:
    scan = scan_images(pair_folder(tmp_path / "pairs"))
    assert scan.layout == FOLDER_LAYOUT
    assert [(r.name, r.control_name, r.caption) for r in scan.records if isinstance(r, EditPair)] == [
        ("training_images/a.png", "control_images/a.png", "make a blue"),
        ("training_images/b.png", "control_images/b.jpg", "make b blue"),
    ]
    assert all("\n" not in line for line in scan.problems)
    expected = {
        "control_images/lonely.jpg": "no target image",
        "training_images/orphan.png": "no control image",
        "training_images/mute.png": "no prompt",
        "training_images/ghost.txt": "without a target image",
        "control_images/notes.gif": "unsupported format",
    }
    assert len(scan.problems) == len(expected)
    for file, why in expected.items():
        assert any(line.startswith(f"{file}: ") and why in line for line in scan.problems), (
            file,
            scan.problems,
        )
    # The content digest covers both images; pixels are target then control.
    record = scan.records[0]
    assert record_files(record) == (record.path, record.control)  # type: ignore[attr-defined]
    pixels = load_pixels(record, 16, scan.root)
    assert pixels.shape == (2, 3, 16, 16) and pixels.dtype == np.float32
    assert pixels[0, 2].mean() > 0.5 > pixels[1, 2].mean()  # the blue target, the red control
    targets, controls = split_pixels(torch.from_numpy(np.stack([pixels, pixels])))
    assert targets.shape == controls.shape == (2, 3, 16, 16)


def test_strict_refuses_the_first_problem_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ImageFolderError) as raised:
        scan_images(pair_folder(tmp_path / "pairs"), strict=True)
    message = str(raised.value)
    assert "\n" not in message and "strict" in message and "(5 problems in all)" in message


def test_metadata_jsonl_pairs_and_their_bad_lines(tmp_path: Path) -> None:
    root = tmp_path / "jsonl"
    for stem in ("a", "b"):
        _image(root / "in" / f"{stem}.jpg")
        _image(root / "out" / f"{stem}.png")
    _image(root / "out" / "stray.png")
    lines = [
        {"control_file_name": "in/a.jpg", "file_name": "out/a.png", "text": "edit a"},
        {"control_file_name": "in/b.jpg", "file_name": "out/b.png", "text": "edit b"},
        {"file_name": "out/stray.png", "text": "no control"},
        {"control_file_name": "../escape.png", "file_name": "out/a.png", "text": "outside"},
        {"control_file_name": "in/missing.jpg", "file_name": "out/b.png", "text": "gone"},
    ]
    (root / "metadata.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + "{broken\n")
    scan = scan_images(root)
    assert scan.layout == JSONL_LAYOUT
    assert [(r.name, r.control_name) for r in scan.records] == [  # type: ignore[attr-defined]
        ("out/a.png", "in/a.jpg"),
        ("out/b.png", "in/b.jpg"),
    ]
    problems = "\n".join(scan.problems)
    assert "metadata.jsonl line 3: control_file_name" in problems
    assert "metadata.jsonl line 4 (../escape.png): control image: escapes the folder" in problems
    assert "metadata.jsonl line 5 (in/missing.jpg): control image: no such file" in problems
    assert "metadata.jsonl line 6: not valid JSON" in problems
    assert len(scan.problems) == 4


def test_demo_pairs_scan_in_both_layouts_and_captioned_folders_are_unchanged(tmp_path: Path) -> None:
    for layout, expected in (("edit-pairs", FOLDER_LAYOUT), ("edit-pairs.jsonl", JSONL_LAYOUT)):
        names = write_image_folder(tmp_path / layout, layout, 3, size=(16, 16))
        scan = scan_images(tmp_path / layout, strict=True)
        assert scan.layout == expected and [r.name for r in scan.records] == names
        assert all(isinstance(r, EditPair) and "upside down" in r.caption for r in scan.records)
    write_image_folder(tmp_path / "plain", "captions.txt", 2, size=(16, 16))
    scan = scan_images(tmp_path / "plain", strict=True)
    assert scan.layout == "captions.txt" and not any(isinstance(r, EditPair) for r in scan.records)
    assert load_pixels(scan.records[0], 16, scan.root).shape == (3, 16, 16)


def _shard(samples: list[bool]) -> bytes:
    """A tar of encoded-looking samples, each with (True) or without (False) a control latent."""
    import io
    import tarfile

    from flux_cluster.data.format import (
        CONTROL_MEMBER,
        TENSOR_COLUMNS,
        encode_tensor,
        sample_json,
        sample_key,
    )

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as archive:
        for index, control in enumerate(samples):
            key = sample_key(index)
            members = {"json": sample_json(key, None)}
            members |= {
                suffix: encode_tensor(np.zeros((2, 2), np.float32)) for suffix in TENSOR_COLUMNS.values()
            }
            if control:
                members[CONTROL_MEMBER] = encode_tensor(np.zeros((2, 2), np.float32))
            for suffix, data in members.items():
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return raw.getvalue()


@pytest.mark.parametrize(
    ("shards", "mixed"),
    [
        ([[True, True], [True]], False),
        ([[False], [False]], False),
        ([[True, False]], True),
        ([[True], [False, False]], True),
    ],
)
def test_verify_wants_a_control_latent_in_every_sample_or_in_none(
    tmp_path: Path, shards: list[list[bool]], mixed: bool
) -> None:
    import io

    from flux_cluster.data.prep.verify import ShardCheck, _check_members, _HashingReader, control_problems

    checks, first = [], 0
    for shard, samples in enumerate(shards):
        check = ShardCheck("train", shard)
        reader = _HashingReader(io.BytesIO(_shard(samples)))
        _check_members(reader, tmp_path / f"{shard}.tar", "train", 0, {}, check, lambda *_: None)
        assert not check.problems
        checks.append(check)
        first += len(samples)
    problems = control_problems(tmp_path, checks)
    if mixed:
        assert problems == [
            f"{tmp_path}: {sum(map(sum, shards))} of {first} samples have a control.bytes (edit pairs); "
            "expected every sample or none"
        ]
    else:
        assert problems == []


def test_a_batch_mixing_edit_pairs_and_plain_samples_is_the_format_error_in_one_line(tmp_path: Path) -> None:
    from flux_cluster.data.format import EMPTY_DIR, EMPTY_FILES, FormatError
    from flux_cluster.data.loader import FluxSample, FluxTaskEncoder

    (tmp_path / EMPTY_DIR).mkdir()
    for name, shape in zip(EMPTY_FILES, [(1, 4, 8), (1, 8)], strict=True):
        np.save(tmp_path / EMPTY_DIR / name, np.zeros(shape, np.float16))
    encoder = FluxTaskEncoder(tmp_path, cfg_dropout=0.0)

    def sample(key: str, control: bool) -> FluxSample:
        latent = torch.zeros(16, 2, 2, dtype=torch.bfloat16)
        return FluxSample(
            __key__=key, __restore_key__=(), t5=torch.zeros(4, 8), clip=torch.zeros(8), mean=latent,
            logvar=latent, timestep=-1, control=latent if control else None,
        )  # fmt: skip

    assert encoder.batch([sample("a", True), sample("b", True)]).control.shape == (2, 16, 2, 2)  # type: ignore[union-attr]
    assert encoder.batch([sample("a", False), sample("b", False)]).control is None
    for order in (
        (True, False),
        (False, True),
    ):  # the first sample decided: a stack of None, or controls lost
        with pytest.raises(FormatError) as caught:
            encoder.batch([sample("a", order[0]), sample("b", order[1])])
        assert str(caught.value) == (
            "a batch of a, b: 1 of 2 samples have a control.bytes (edit pairs); expected every sample or none"
        )


# ---- crafted pairs: every one a bounded line naming the file and the field, escapes spelled out

CRAFTED_RECORDS = {  # a metadata.jsonl record (or line): what its problem line says
    "control not a string": (
        {"control_file_name": 5, "file_name": "t.png", "text": "x"},
        "control_file_name",
    ),
    "absolute control": ({"control_file_name": "/etc/passwd", "file_name": "t.png", "text": "x"}, "absolute"),
    "escaping control": ({"control_file_name": "../../x.png", "file_name": "t.png", "text": "x"}, "escapes"),
    "escapes in the control": (
        {"control_file_name": "c\x1b]0;pwn\x07.png", "file_name": "t.png", "text": "x"},
        "(c\\x1b]0;pwn\\x07.png): control image: no such file",
    ),
    "a megabyte path": (
        {"control_file_name": "c" * 500_000, "file_name": "t.png", "text": "x"},
        "File name too long",
    ),
    "a megabyte target": (
        {"control_file_name": "c.png", "file_name": "t" * 500_000, "text": "x"},
        "File name too long",
    ),
    "prompt not a string": (
        {"control_file_name": "c.png", "file_name": "t.png", "text": [1]},
        "'text': expected",
    ),
    "empty prompt": ({"control_file_name": "c.png", "file_name": "t.png", "text": "  "}, "empty caption"),
    "a list": (["c.png", "t.png"], "expected an object"),
    "deep nesting": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "a 5000-digit number": ('{"control_file_name": ' + "9" * 5000 + "}", "not valid JSON"),
    "not JSON, with escapes": ("\x1b[2J{", "not valid JSON"),
}


@pytest.mark.parametrize("case", CRAFTED_RECORDS)
def test_a_crafted_metadata_jsonl_record_is_one_bounded_line(tmp_path: Path, case: str) -> None:
    from flux_cluster.safe_text import printable

    root = tmp_path / "jsonl"
    _image(root / "c.png")
    _image(root / "t.png")
    good = {"control_file_name": "c.png", "file_name": "t.png", "text": "the good pair"}
    record, expected = CRAFTED_RECORDS[case]
    crafted = record if isinstance(record, str) else json.dumps(record)
    (root / "metadata.jsonl").write_text(json.dumps(good) + "\n" + crafted + "\n")
    scan = scan_images(root)
    assert [r.name for r in scan.records] == ["t.png"]  # the good pair stays
    assert len(scan.problems) == 1, scan.problems
    (line,) = scan.problems
    assert line.startswith("metadata.jsonl line 2") and expected in line, line
    assert "\n" not in line and len(line) < 600 and printable(line) == line


CRAFTED_PROMPTS = {  # training_images/NAME.txt's bytes: its problem line, or None (a usable prompt)
    "binary": (b"\xff\xfe\x00\x01", "not UTF-8 text"),
    "a megabyte": (b"x" * (1 << 20), "longer than"),
    "empty": (b" \n\t", "empty prompt"),
    "escapes": (b"make it \x1b[2Jblue\x07", None),
}


@pytest.mark.parametrize("case", CRAFTED_PROMPTS)
def test_a_crafted_prompt_file_is_one_line_or_a_prompt_kept_as_data(tmp_path: Path, case: str) -> None:
    root = tmp_path / "pairs"
    for stem in ("p", "good"):
        _image(root / "control_images" / f"{stem}.png")
        _image(root / "training_images" / f"{stem}.png")
    (root / "training_images" / "good.txt").write_text("a good prompt")
    data, expected = CRAFTED_PROMPTS[case]
    (root / "training_images" / "p.txt").write_bytes(data)
    scan = scan_images(root)
    prompts = [r.caption for r in scan.records]
    if expected is None:  # a prompt is the model's input, kept as written; lines that show it escape it
        assert prompts == ["a good prompt", "make it \x1b[2Jblue\x07"] and not scan.problems
        return
    assert prompts == ["a good prompt"] and len(scan.problems) == 1
    assert scan.problems[0].startswith("training_images/p.png: ") and expected in scan.problems[0]


@pytest.mark.parametrize("how", ["a FIFO", "a symlink out", "a folder"])
def test_a_prompt_or_control_that_is_no_regular_file_inside_is_skipped_unread(
    tmp_path: Path, how: str
) -> None:
    import os

    root = tmp_path / "pairs"
    for stem in ("p", "good"):
        _image(root / "control_images" / f"{stem}.png")
        _image(root / "training_images" / f"{stem}.png")
    (root / "training_images" / "good.txt").write_text("a good prompt")
    prompt = root / "training_images" / "p.txt"
    if how == "a FIFO":
        os.mkfifo(prompt)
    elif how == "a symlink out":
        (tmp_path / "secret.txt").write_text("secret")
        prompt.symlink_to(tmp_path / "secret.txt")
    else:
        prompt.mkdir()
    scan = scan_images(root)  # a FIFO would block an open() forever
    assert len(scan.records) == 1 and len(scan.problems) == 1 and "training_images/p.png" in scan.problems[0]


VAL_SHARDS = {  # a val sample's json member: the line evaluate gives for an edit run's shard
    "deep nesting": (b"[" * 20_000 + b"]" * 20_000, "nested too deeply"),
    "a huge member": (b'{"key": "' + b"k" * 100_000 + b'"}', 'with its "key" string'),
    "a number key": (b'{"key": 5}', 'with its "key" string'),
    "no key": (b"[1, 2]", 'with its "key" string'),
    "not JSON": (b"\x1b[2J", "not valid JSON"),
}


@pytest.mark.parametrize("case", VAL_SHARDS)
def test_a_crafted_val_shard_of_an_edit_run_is_one_line_naming_it(tmp_path: Path, case: str) -> None:
    """evaluate finds an edit run's held-out pairs by the keys its val shards record."""
    import io
    import tarfile

    from flux_cluster.errors import FluxClusterError
    from flux_cluster.evaluate.edits import val_keys
    from flux_cluster.safe_text import printable

    data, expected = VAL_SHARDS[case]
    (tmp_path / "val").mkdir()
    shard = tmp_path / "val" / "shard-000000.tar"
    with tarfile.open(shard, "w") as archive:
        member = tarfile.TarInfo("pair\x1b[2J.json")
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))
    with pytest.raises(FluxClusterError) as caught:
        val_keys(tmp_path)
    message = str(caught.value)
    assert str(shard) in message and expected in message, message
    assert "\n" not in message and len(message) < 600 and printable(message) == message
