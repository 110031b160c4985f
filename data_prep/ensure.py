"""Synthetic training data on demand: what ``flux-cluster submit`` makes when a system asks for it
(``train.synthetic_data``) and no dataset is there yet. Made once, then reused from the user cache."""

import fcntl
import json
import os
from pathlib import Path

from rich.console import Console

from flux_cluster.config.training import SyntheticDataConfig
from flux_cluster.errors import FluxClusterError

READY_FILE = ".nv-meta/.info.json"
SPEC_FILE = "synthetic-spec.json"


def default_root(spec: SyntheticDataConfig) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    name = f"synthetic-{spec.dims}-{spec.train}-{spec.val}-seed{spec.seed}"
    return cache / "flux-cluster" / "data" / name / "energon"


def ensure_synthetic_root(spec: SyntheticDataConfig, root: Path, console: Console) -> Path:
    """The Energon root at ``root``, generated (synth, convert, index, verify) unless already complete or
    already holding a dataset that was not generated here."""
    from data_prep.stages import StagePaths, run_stage
    from data_prep.synthetic import synthesize

    wanted = spec.model_dump()
    if _ready(root, wanted) or _foreign_dataset(root):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with (root.parent / ".flux-cluster.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two submits at once: the second waits and reuses the data
        if _ready(root, wanted):
            return root
        console.print(
            f"[bold]data[/bold] making synthetic data ({spec.train} train, {spec.val} val) in {root}"
        )
        source = root.parent / "source"
        synthesize(source, train=spec.train, val=spec.val, dims=spec.dims, seed=spec.seed, force=True)
        paths = StagePaths(source=source, output=root)
        for stage in ("convert", "index", "verify"):
            if not run_stage(stage, paths, workers=2, shard_size=max(64, spec.train // 8), console=console):
                raise FluxClusterError(f"{root}: the synthetic dataset failed verification")
        (root / SPEC_FILE).write_text(json.dumps(wanted) + "\n")
    return root


def _foreign_dataset(root: Path) -> bool:
    """A prepared dataset that this module did not make (e.g. the real one): used as it is, never touched."""
    return (root / READY_FILE).is_file() and not (root / SPEC_FILE).exists()


def _ready(root: Path, wanted: dict) -> bool:
    try:
        return (root / READY_FILE).is_file() and json.loads((root / SPEC_FILE).read_text()) == wanted
    except (OSError, ValueError):
        return False
