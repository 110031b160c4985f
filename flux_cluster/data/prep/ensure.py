"""Synthetic training data on demand: what ``flux-cluster submit`` makes when a system asks for it
(``train.synthetic_data``) and no dataset is there yet. Made once, then reused from the user cache.

Synthetic data is written only into the user cache or into a data root the user named that exists and
is empty (or already holds synthetic data of the same spec); never into a folder that does not exist
or holds something else. The generator's source files and lock always stay in the cache."""

import fcntl
import json
import os
import shutil
from pathlib import Path

from rich.console import Console

from flux_cluster.atomic import write_atomic
from flux_cluster.config.training import SyntheticDataConfig
from flux_cluster.errors import FluxClusterError

READY_FILE = ".nv-meta/.info.json"
SPEC_FILE = "synthetic-spec.json"
"""Written last: the synthetic dataset is complete."""
MARK_FILE = ".flux-cluster-synthetic"
"""Written first (the spec): this folder is being filled with synthetic data, so a re-run may resume."""


def default_root(spec: SyntheticDataConfig) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    name = f"synthetic-{spec.dims}-{spec.train}-{spec.val}-seed{spec.seed}"
    return cache / "flux-cluster" / "data" / name / "energon"


def check_synthetic_root(spec: SyntheticDataConfig, root: Path) -> None:
    """Raise unless synthetic data may go into ``root``, a folder the user named: it must exist and be
    empty, hold a prepared dataset (used as it is), or hold synthetic data of this spec."""
    where = f"paths.data_root: {root}"
    if not root.exists():
        raise FluxClusterError(
            f"{where} does not exist; create it (empty) to get synthetic data there, or name a prepared "
            "Energon root"
        )
    if not root.is_dir():
        raise FluxClusterError(f"{where} is not a folder")
    if _foreign_dataset(root) or not any(root.iterdir()):
        return
    marked = _marked_spec(root)
    if marked is None:
        raise FluxClusterError(
            f"{where} holds files but no Energon dataset (.nv-meta); synthetic data goes only into an empty "
            "folder: name an empty one or a prepared root"
        )
    if marked != spec.model_dump():
        raise FluxClusterError(
            f"{where} holds synthetic data made with other train.synthetic_data settings ({marked}); "
            "empty it or name another folder"
        )


def ensure_synthetic_root(
    spec: SyntheticDataConfig, root: Path, console: Console, *, explicit: bool = False
) -> Path:
    """The Energon root at ``root``, generated (synth, convert, index, verify) unless already complete or
    already holding a dataset that was not generated here. ``explicit``: the user named ``root``
    (check_synthetic_root applies); else it is the cache's own folder."""
    from flux_cluster.data.prep.stages import StagePaths, run_stage
    from flux_cluster.data.prep.synthetic import synthesize

    wanted = spec.model_dump()
    if _ready(root, wanted) or _foreign_dataset(root):
        return root
    if explicit:
        check_synthetic_root(spec, root)
    work = default_root(spec).parent  # the tool's cache: source and lock never land beside a user's folder
    work.mkdir(parents=True, exist_ok=True)
    with (work / ".flux-cluster.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two submits at once: the second waits and reuses the data
        if _ready(root, wanted):
            return root
        console.print(
            f"[bold]data[/bold] making synthetic data ({spec.train} train, {spec.val} val) in {root}"
        )
        root.mkdir(parents=True, exist_ok=True)
        write_atomic(root / MARK_FILE, json.dumps(wanted) + "\n")
        source = work / "source"
        shutil.rmtree(source, ignore_errors=True)  # the cache's own scratch: whatever an earlier run left
        synthesize(source, train=spec.train, val=spec.val, dims=spec.dims, seed=spec.seed)
        paths = StagePaths(source=source, output=root)
        for stage in ("convert", "index", "verify"):
            if not run_stage(stage, paths, workers=2, shard_size=max(64, spec.train // 8), console=console):
                raise FluxClusterError(f"{root}: the synthetic dataset failed verification")
        write_atomic(root / SPEC_FILE, json.dumps(wanted) + "\n")
    return root


def _marked_spec(root: Path) -> dict | None:
    """The spec of the synthetic data in root (complete or being made), or None."""
    for name in (SPEC_FILE, MARK_FILE):
        try:
            return json.loads((root / name).read_text())
        except (OSError, ValueError, RecursionError):
            continue
    return None


def _foreign_dataset(root: Path) -> bool:
    """A prepared dataset that this module did not make (e.g. the real one): used as it is, never touched."""
    return (root / READY_FILE).is_file() and _marked_spec(root) is None


def _ready(root: Path, wanted: dict) -> bool:
    try:
        return (root / READY_FILE).is_file() and json.loads((root / SPEC_FILE).read_text()) == wanted
    except (OSError, ValueError, RecursionError):
        return False
