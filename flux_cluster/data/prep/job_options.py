"""The options file of a data encode job: written by 'flux-cluster data encode --submit' beside each job's
config, read by the job (never rendered into its script)."""

import dataclasses
import json
import os
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flux_cluster.atomic import write_atomic
from flux_cluster.errors import FluxClusterError
from flux_cluster.runtime.job_file import read_job_file

if TYPE_CHECKING:
    from flux_cluster.data.prep.encode import EncodeOptions

ENCODE_OPTIONS_FILE = "encode.json"
"""In an encode stage's run directory: its EncodeOptions, every path absolute."""


def write_encode_options(run_dir: Path, options: "EncodeOptions") -> None:
    data = {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(options).items()}
    write_atomic(run_dir / ENCODE_OPTIONS_FILE, json.dumps(data, indent=1) + "\n")


def _expected(kind: Any) -> str:
    if kind is bool:
        return "true or false"
    if kind is int:
        return "an integer"
    if kind is float:
        return "a number"
    return "an absolute path" + (" or null" if type(None) in typing.get_args(kind) else "")


def _field_value(path: Path, key: str, kind: Any, value: object) -> object:
    """value as the EncodeOptions field of type kind wants it; one line naming the file and key if not."""
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind in (int, float):
        ok = isinstance(value, int | float if kind is float else int) and not isinstance(value, bool)
    else:  # Path or Path | None
        if value is None and type(None) in typing.get_args(kind):
            return None
        ok = isinstance(value, str) and os.path.isabs(value)
        value = Path(value) if ok else value  # type: ignore[arg-type]
    if not ok:
        raise FluxClusterError(f"{path}: {key}: got {value!r}, expected {_expected(kind)}")
    return value


def read_encode_options(path: Path) -> "EncodeOptions":
    """The options write_encode_options wrote; anything else is one line naming the file and the key."""
    from flux_cluster.data.prep.encode import EncodeOptions

    written_by = "the encode options 'flux-cluster data encode --submit' writes"
    data = read_job_file(path, written_by)
    kinds = typing.get_type_hints(EncodeOptions)
    fields = [f.name for f in dataclasses.fields(EncodeOptions)]
    for key in data:
        if key not in kinds:
            raise FluxClusterError(f"{path}: {key}: unknown key, expected one of {', '.join(fields)}")
    for key in fields:
        if key not in data:
            raise FluxClusterError(f"{path}: {key}: missing, expected {_expected(kinds[key])}")
    return EncodeOptions(**{key: _field_value(path, key, kinds[key], data[key]) for key in fields})  # type: ignore[arg-type]
