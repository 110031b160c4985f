"""The options of one evaluation (flux-cluster evaluate, api.evaluate) and their JSON form: what
``evaluate --submit`` writes beside the job's config (OPTIONS_FILE) for the job to read back. Importing
this module stays cheap (no torch)."""

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flux_cluster.errors import FluxClusterError
from flux_cluster.evaluate import DEFAULT_RUNS


@dataclass(frozen=True)
class EvalOptions:
    target: Path
    model: Path | None = None
    prompts: Path | None = None
    runs: int = DEFAULT_RUNS
    """Timed generations per prompt, for each model."""
    warmup: int = 2
    steps: int | None = None
    guidance: float | None = None
    resolution: int = 512
    max_sequence_length: int | None = None
    clip: Path | None = None
    exp: int = 0
    output: Path | None = None
    seed: int = 0
    system: str | None = None


_PATHS = ("target", "model", "prompts", "clip", "output")
_MINIMUMS = {"runs": 1, "warmup": 0, "steps": 1, "resolution": 16, "max_sequence_length": 1, "exp": 0}
"""The least each integer option may be (seed: any integer)."""


def check_options(options: EvalOptions) -> None:
    """What the CLI's option parser checks, for callers that come another way (api.evaluate, the job)."""
    for name, least in _MINIMUMS.items():
        value = getattr(options, name)
        if value is not None and value < least:
            raise FluxClusterError(f"--{name.replace('_', '-')} {value}: expected at least {least}")
    if options.guidance is not None and options.guidance < 0:
        raise FluxClusterError(f"--guidance {options.guidance}: expected at least 0")
    if options.resolution % 16:
        raise FluxClusterError(
            f"--resolution {options.resolution}: expected a multiple of 16 (FLUX's latent patches)"
        )


def options_to_json(options: EvalOptions) -> dict[str, Any]:
    return {
        name: str(value) if isinstance(value, Path) else value
        for name, value in dataclasses.asdict(options).items()
    }


def options_from_json(data: object, where: str) -> EvalOptions:
    """options_to_json's output back; anything else is one FluxClusterError line naming where and the key."""
    names = [f.name for f in dataclasses.fields(EvalOptions)]
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise FluxClusterError(f"{where}: got {kind}, expected an object of evaluate's options")
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise FluxClusterError(f"{where}: unknown key {unknown[0]!r}; expected some of {', '.join(names)}")
    if "target" not in data:
        raise FluxClusterError(f"{where}: no 'target': expected the evaluation's TARGET")
    options = EvalOptions(**{name: _value(name, value, where) for name, value in data.items()})
    try:
        check_options(options)
    except FluxClusterError as exc:
        raise FluxClusterError(f"{where}: {exc}") from None
    return options


def _value(name: str, value: object, where: str) -> Any:
    if value is None and name != "target" and name not in ("runs", "warmup", "resolution", "exp", "seed"):
        return None
    if name in _PATHS:
        ok, expected = isinstance(value, str) and bool(value), "a path"
    elif name == "system":
        ok, expected = isinstance(value, str), "a system name"
    elif name == "guidance":
        ok, expected = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    else:
        ok, expected = isinstance(value, int) and not isinstance(value, bool), "an integer"
    if not ok:
        raise FluxClusterError(f"{where}: {name}: got {value!r}, expected {expected}")
    if name in _PATHS:
        return Path(str(value))
    return float(value) if name == "guidance" else value  # type: ignore[arg-type]
