"""The options of one evaluation (flux-cluster evaluate, api.evaluate) and their JSON form: what
``evaluate --submit`` writes beside the job's config (OPTIONS_FILE) for the job to read back. Importing
this module stays cheap (no torch)."""

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flux_cluster.config.transformer_config import resolution_problem, token_problem
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
_MINIMUMS = {"runs": 1, "warmup": 0, "steps": 1, "exp": 0}
"""The least each count may be (resolution, max_sequence_length and seed: check_options)."""


MAX_SEED = 2**63 - 1
"""torch's generator seeds (prompt i uses seed + i, i < 256: still in torch's range up to 2**64 - 1)."""


def check_options(options: EvalOptions) -> None:
    """The options' bounds, before anything loads: the CLI's, api.evaluate's and the job's (one
    FluxClusterError line naming the option and its limit)."""
    for name, least in _MINIMUMS.items():
        value = getattr(options, name)
        if value is not None and value < least:
            raise FluxClusterError(f"--{name.replace('_', '-')} {value}: expected at least {least}")
    if options.guidance is not None and not 0 <= options.guidance < float("inf"):
        raise FluxClusterError(f"--guidance {options.guidance}: expected a finite number, at least 0")
    problem = resolution_problem(options.resolution)
    if problem:
        raise FluxClusterError(f"--resolution {options.resolution}: {problem}")
    problem = None if options.max_sequence_length is None else token_problem(options.max_sequence_length)
    if problem:
        raise FluxClusterError(f"--max-sequence-length {options.max_sequence_length}: {problem}")
    if not 0 <= options.seed <= MAX_SEED:
        raise FluxClusterError(f"--seed {options.seed}: expected 0 to 2**63 - 1 (torch's seed range)")


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
