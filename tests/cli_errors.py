"""The one check of every command's bad input: one clean line, no traceback."""

import re
import subprocess

from typer.testing import Result

BOX_DRAWING = re.compile("[\u2500-\u257f]")


def one_line_error(result: Result | subprocess.CompletedProcess[str]) -> str:
    """THE check for every command's bad input: a non-zero exit and one line naming the problem (no
    traceback, no box); returns that line."""
    if isinstance(result, Result):
        code, output = result.exit_code, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    else:
        code, output = result.returncode, result.stdout + result.stderr
    assert code != 0, output
    assert "Traceback" not in output and not BOX_DRAWING.search(output), output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0]


def error_line(result: Result) -> str:
    """A usage or config error: one_line_error on stderr, with exit code 2."""
    assert result.exit_code == 2, result.output
    return one_line_error(result)
