"""flux_cluster.outside, the one reader of files we do not control: regular files only (no symlink,
FIFO or device, checked on the opened file), inside their folder, bounded in bytes, and JSON that fails
as one OutsideFileError line (deep nesting, 5000-digit numbers)."""

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flux_cluster.errors import FluxClusterError
from flux_cluster.outside import (
    OutsideFileError,
    open_regular,
    parse_json,
    read_bounded,
    read_json,
    read_json_object,
    read_tail,
)


def _within(call: Callable[[], Any], seconds: float = 10) -> Any:
    """call(), failing the test instead of hanging it (opening a FIFO for reading blocks without a writer)."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # handed to the test
            result.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert result, f"still running after {seconds} s"
    return result[0]


def _one_line(error: Any, *parts: str) -> str:
    assert isinstance(error, OutsideFileError) and isinstance(error, FluxClusterError), error
    text = str(error)
    assert "\n" not in text and all(part in text for part in parts), text
    return text


def test_a_regular_file_is_read_whole_within_its_bound(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"x": [1, 2]}')
    assert read_bounded(tmp_path / "a.json", 100, inside=tmp_path) == b'{"x": [1, 2]}'
    assert read_json(tmp_path / "a.json") == {"x": [1, 2]}
    assert read_json_object(tmp_path / "a.json", inside=tmp_path) == {"x": [1, 2]}
    assert read_tail(tmp_path / "a.json", 4) == b" 2]}"
    assert read_tail(tmp_path / "a.json", 99) == b'{"x": [1, 2]}'


def test_a_symlink_is_refused_even_to_a_regular_file_inside(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    error = _within(lambda: read_json(tmp_path / "link.json", inside=tmp_path))
    _one_line(error, "link.json", "symbolic link")


def test_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    error = _within(lambda: read_bounded(tmp_path / "pipe", 100))
    _one_line(error, "pipe", "not a regular file")
    _one_line(_within(lambda: read_tail(tmp_path / "pipe", 100)), "not a regular file")


def test_dev_zero_and_a_folder_are_refused(tmp_path: Path) -> None:
    _one_line(_within(lambda: read_bounded("/dev/zero", 1 << 20)), "/dev/zero", "not a regular file")
    _one_line(_within(lambda: read_json(tmp_path)), "not a regular file")
    _one_line(_within(lambda: read_json(tmp_path / "missing.json")), "missing.json", "no such file")


def test_a_file_over_its_bound_is_one_line_naming_the_bound(tmp_path: Path) -> None:
    (tmp_path / "big.json").write_bytes(b"[" + b"0," * 4096 + b"0]")
    with pytest.raises(OutsideFileError) as refused:
        read_json(tmp_path / "big.json", limit=4096)
    _one_line(refused.value, "big.json", "over 4 KiB; refused")
    assert read_tail(tmp_path / "big.json", 3) == b",0]"


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"a": ' * 50_000 + "1" + "}" * 50_000,
        "9" * 5000,
        '{"n": -' + "1" * 5000 + "}",
    ],
    ids=["deep list", "deep object", "5000 digits", "5000 digits inside"],
)
def test_json_past_the_parsers_limits_is_one_line(tmp_path: Path, text: str) -> None:
    _one_line(_within(lambda: parse_json(text, "where.json")), "where.json")
    (tmp_path / "f.json").write_text(text)
    _one_line(_within(lambda: read_json(tmp_path / "f.json", limit=1 << 20)), "f.json")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_any_bytes_parse_or_fail_as_one_line(data: bytes) -> None:
    try:
        parse_json(data, "x.json")
    except OutsideFileError as exc:
        _one_line(exc, "x.json")


def test_read_json_object_refuses_another_type(tmp_path: Path) -> None:
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(OutsideFileError, match=r"list\.json: expected a JSON object, found list"):
        read_json_object(tmp_path / "list.json")


def test_a_path_swapped_for_a_symlink_out_of_its_folder_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.json").write_text('{"secret": 1}')
    (root / "sub" / "state.json").write_text("{}")
    assert read_json(root / "sub" / "state.json", inside=root) == {}
    # The file swapped for a symlink out of the folder, after it was found.
    (root / "sub" / "state.json").unlink()
    (root / "sub" / "state.json").symlink_to(outside / "secret.json")
    _one_line(_within(lambda: read_json(root / "sub" / "state.json", inside=root)), "symbolic link")
    # Its folder swapped for a symlink out of the folder: the file itself is regular, but outside.
    (root / "sub" / "state.json").unlink()
    (root / "sub").rmdir()
    (root / "sub").symlink_to(outside)
    (outside / "state.json").write_text("{}")
    _one_line(_within(lambda: read_json(root / "sub" / "state.json", inside=root)), "outside", "refused")
    with pytest.raises(OutsideFileError, match="outside"), open_regular(root / "sub" / "state.json", root):
        pass
