"""evaluate's and data encode's numbers bounded at the option, by FLUX's real limits, in one line each,
before a model loads; names from the command line reach the error line with control characters spelled
out."""

from pathlib import Path

import pytest
from cli_errors import error_line
from typer.testing import CliRunner

from flux_cluster.cli import app

EVALUATE = {  # option and value: what the line says
    ("--seed", str(2**70)): "--seed 1180591620717411303424: expected 0 to 2**63 - 1",
    ("--seed", "-1"): "--seed -1: expected 0 to 2**63 - 1",
    ("--resolution", "1048576"): "--resolution 1048576: expected a multiple of 16 from 16 to 4,096",
    ("--resolution", "8"): "--resolution 8: expected a multiple of 16 from 16 to 4,096",
    ("--max-sequence-length", "100000000"): "--max-sequence-length 100000000: expected 1 to 512 (T5's limit",
    ("--max-sequence-length", "0"): "--max-sequence-length 0: expected 1 to 512",
    ("--guidance", "inf"): "--guidance inf: expected a finite number",
}


@pytest.mark.parametrize(("option", "value"), EVALUATE)
def test_evaluate_bounds_its_numbers_at_the_option(
    cli: CliRunner, tmp_path: Path, option: str, value: str
) -> None:
    lora = tmp_path / "lora.safetensors"
    lora.write_bytes(b"")  # never read: the options are checked first
    line = error_line(cli.invoke(app, ["evaluate", str(lora), option, value]))
    assert EVALUATE[(option, value)] in line, line


ENCODE = {
    ("--resolution", "1048576"): "--resolution 1048576: expected a multiple of 16 from 16 to 4,096",
    ("--max-sequence-length", "100000"): "--max-sequence-length 100000: expected 1 to 512",
}


@pytest.mark.parametrize(("option", "value"), ENCODE)
def test_data_encode_bounds_its_numbers_at_the_option(
    cli: CliRunner, tmp_path: Path, option: str, value: str
) -> None:
    (tmp_path / "images").mkdir()
    args = ["data", "encode", str(tmp_path / "images"), str(tmp_path / "out"), "--model", str(tmp_path)]
    line = error_line(cli.invoke(app, [*args, option, value]))
    assert ENCODE[(option, value)] in line, line
    assert not (tmp_path / "out").exists()


def test_an_evaluate_target_reaches_the_error_line_with_its_escapes_spelled_out(
    cli: CliRunner, tmp_path: Path
) -> None:
    target = tmp_path / "run\x1b[2J\x07\u202e"
    line = error_line(cli.invoke(app, ["evaluate", str(target)]))
    assert "run\\x1b[2J\\x07\\u202e: does not exist" in line and "\x1b" not in line
    target.mkdir()
    (target / "notes.txt").write_text("x")
    line = error_line(cli.invoke(app, ["evaluate", str(target)]))
    assert "run\\x1b[2J\\x07\\u202e: nothing to evaluate" in line and "\x1b" not in line
