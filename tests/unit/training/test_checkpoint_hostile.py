"""A crafted checkpoint folder never runs code, reads outside the folder or hangs a resume: its rank
state and DCP's metadata are read as data only, its manifest names plain files of the folder only, and
a bad one is skipped (one line) for the previous good checkpoint, or a fresh start."""

import hashlib
import io
import json
import os
import pickle
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from flux_cluster.training.checkpoint import Checkpointer, from_plain, to_plain


class _Runs:
    """Unpickling this creates the file `marker`: stands for any code a pickle can run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def _small(fill: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(8, 8)
    with torch.no_grad():
        model.weight.fill_(fill)
    return model, torch.optim.AdamW(model.parameters())


def _two_checkpoints(folder: Path) -> Checkpointer:
    checkpoints = Checkpointer(folder, keep=3, rank=0, world_size=1)
    for step in (1, 2):
        checkpoints.save(step, *_small(float(step)), {"samples": step}, {"rank_value": step})
    return checkpoints


def _rewrite_manifest(step: Path, change: Callable[[dict[str, Any]], None] | None = None) -> None:
    """The manifest made to match the folder's files again (what a crafted checkpoint would ship)."""
    manifest = json.loads((step / "manifest.json").read_text())
    for name in manifest["files"]:
        path = step / name
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if change:
        change(manifest["files"])
    (step / "manifest.json").write_text(json.dumps(manifest))


def _choose_within(checkpoints: Checkpointer, seconds: float = 10) -> tuple[Path | None, list[str]]:
    """choose(), failing the test instead of hanging it (a read of /dev/zero or a FIFO never ends)."""
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(checkpoints.choose()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert result, f"choose() still running after {seconds} s"
    return result[0]


def _falls_back_to_step_1(checkpoints: Checkpointer, folder: Path, reason: str) -> None:
    chosen, skipped = _choose_within(checkpoints)
    assert chosen == folder / "step_00000001", skipped
    (line,) = skipped
    assert "step_00000002 skipped" in line and reason in line and "\n" not in line, line
    model, optimizer = _small(0.0)
    shared, mine = checkpoints.load(chosen, model, optimizer)
    assert shared["samples"] == 1 and mine["rank_value"] == 1 and torch.all(model.weight == 1.0)


def test_a_rank_state_pickle_that_runs_code_is_refused(tmp_path: Path) -> None:
    checkpoints = _two_checkpoints(tmp_path / "ck")
    marker = tmp_path / "ran"
    step = tmp_path / "ck" / "step_00000002"
    buffer = io.BytesIO()
    torch.save({"rank_value": _Runs(marker)}, buffer)
    (step / "rank_00000.pt").write_bytes(buffer.getvalue())
    _rewrite_manifest(step)
    _falls_back_to_step_1(checkpoints, tmp_path / "ck", "rank_00000.pt is not plain checkpoint data")
    assert not marker.exists()


def test_a_dcp_metadata_pickle_that_runs_code_is_refused(tmp_path: Path) -> None:
    checkpoints = _two_checkpoints(tmp_path / "ck")
    marker = tmp_path / "ran"
    step = tmp_path / "ck" / "step_00000002"
    (step / ".metadata").write_bytes(pickle.dumps(_Runs(marker)))
    _rewrite_manifest(step)
    _falls_back_to_step_1(checkpoints, tmp_path / "ck", "open is not part of DCP metadata")
    assert not marker.exists()


def test_dcp_metadata_naming_a_shard_outside_the_manifest_is_refused(tmp_path: Path) -> None:
    checkpoints = _two_checkpoints(tmp_path / "ck")
    step = tmp_path / "ck" / "step_00000002"
    with (step / ".metadata").open("rb") as handle:
        metadata = pickle.load(handle)  # our own, trusted here
    for info in metadata.storage_data.values():
        info.relative_path = "../step_00000001/__0_0.distcp"
    (step / ".metadata").write_bytes(pickle.dumps(metadata))
    _rewrite_manifest(step)
    _falls_back_to_step_1(checkpoints, tmp_path / "ck", "not a file of the manifest")


def _fifo(step: Path) -> str:
    os.mkfifo(step / "pipe")
    return "pipe"


def _symlink_out(step: Path) -> str:
    (step.parent.parent / "secret").write_bytes(b"s")
    (step / "link").symlink_to(step.parent.parent / "secret")
    return "link"


BAD_ENTRIES: dict[str, tuple[Callable[[Path], str], str]] = {
    "/dev/zero": (lambda _step: "/dev/zero", "expected a file name in the checkpoint folder"),
    "traversal": (lambda _step: "../step_00000001/__0_0.distcp", "expected a file name in the checkpoint"),
    "fifo": (_fifo, "pipe is not a regular file"),
    "symlink": (_symlink_out, "link is not a regular file"),
}


@pytest.mark.parametrize("bad", BAD_ENTRIES)
def test_a_manifest_entry_that_is_not_a_plain_file_of_the_folder_is_refused_without_hanging(
    tmp_path: Path, bad: str
) -> None:
    checkpoints = _two_checkpoints(tmp_path / "ck")
    step = tmp_path / "ck" / "step_00000002"
    make, reason = BAD_ENTRIES[bad]
    name = make(step)
    content = b"s" if bad == "symlink" else b""  # what the entry's size and sha256 say it holds
    entry = {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    _rewrite_manifest(step, lambda files: files.update({name: entry}))
    _falls_back_to_step_1(checkpoints, tmp_path / "ck", reason)


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000 + "]" * 100_000, '{"files": {}, "step": ' + "9" * 5000 + "}"],
    ids=["deep nesting", "5000-digit number"],
)
def test_a_manifest_nested_too_deeply_or_with_a_huge_number_falls_back_in_one_line(
    tmp_path: Path, text: str
) -> None:
    checkpoints = _two_checkpoints(tmp_path / "ck")
    (tmp_path / "ck" / "step_00000002" / "manifest.json").write_text(text)
    _falls_back_to_step_1(checkpoints, tmp_path / "ck", "manifest.json is unreadable")


def test_a_checkpoint_in_the_old_pickled_format_is_refused_and_training_starts_fresh(tmp_path: Path) -> None:
    from megatron.energon.flavors.webdataset.sample_loader import SliceState

    checkpoints = Checkpointer(tmp_path, keep=3, rank=0, world_size=1)
    step = checkpoints.save(1, *_small(1.0), {}, {})
    buffer = io.BytesIO()
    torch.save({"loader": SliceState(index=0, current=3)}, buffer)  # what a rank file held before
    (step / "rank_00000.pt").write_bytes(buffer.getvalue())
    _rewrite_manifest(step)
    chosen, skipped = _choose_within(checkpoints)
    assert chosen is None and len(skipped) == 1 and "older version" in skipped[0], skipped


def _loader_state() -> Any:
    """A train loader's saved state with workers (every class it is made of), as Energon builds it."""
    from collections import OrderedDict

    from megatron.energon.flavors.webdataset.sample_loader import SliceState
    from megatron.energon.rng import SystemRngState
    from megatron.energon.savable_loader import (
        SavableDataLoaderState,
        SavableDatasetCheckpoint,
        SavableDatasetState,
    )
    from megatron.energon.state import FlexState

    rng = SystemRngState(torch=torch.get_rng_state(), numpy=np.random.get_state(), random=random.getstate())
    dataset = FlexState(
        __class__="WebdatasetSampleLoaderDataset", slices=[SliceState(index=1, current=7)], rng=b"\x00\x01"
    )
    worker = SavableDatasetCheckpoint(
        state=SavableDatasetState(rng=rng, dataset_state=dataset, sample_index=5), offset=2
    )
    other = OrderedDict(a=np.arange(3, dtype=np.uint32))
    return SavableDataLoaderState(worker_states=[worker, other], next_worker_id=1, micro_batch_size=4)


def test_loader_state_round_trips_through_a_checkpoint_as_plain_data(tmp_path: Path) -> None:
    state = _loader_state()
    checkpoints = Checkpointer(tmp_path, keep=1, rank=0, world_size=1)
    step = checkpoints.save(1, *_small(1.0), {}, {"loader": state, "torch_rng": torch.get_rng_state()})
    torch.load(step / "rank_00000.pt", weights_only=True)  # plain data: no pickled objects in it
    chosen, skipped = checkpoints.choose()
    assert chosen == step and skipped == []
    _shared, mine = checkpoints.load(chosen, *_small(0.0))
    back = mine["loader"]
    assert type(back) is type(state) and back.next_worker_id == 1 and back.micro_batch_size == 4
    worker = back.worker_states[0]
    assert worker.offset == 2 and worker.state.sample_index == 5
    assert worker.state.dataset_state == state.worker_states[0].state.dataset_state
    assert type(worker.state.dataset_state).__name__ == "FlexState"
    rng = worker.state.rng
    assert torch.equal(rng.torch, state.worker_states[0].state.rng.torch)
    assert rng.random == state.worker_states[0].state.rng.random
    np.testing.assert_array_equal(rng.numpy[1], state.worker_states[0].state.rng.numpy[1])
    np.testing.assert_array_equal(back.worker_states[1]["a"], np.arange(3, dtype=np.uint32))


def test_plain_data_names_only_the_loader_state_classes() -> None:
    plain = to_plain(_loader_state())
    plain["fields"]["worker_states"][0]["__flux_state__"] = "Popen"
    with pytest.raises(ValueError, match="not a loader state class"):
        from_plain(plain)
    with pytest.raises(ValueError, match="objects"):
        from_plain({"__flux_state__": "ndarray", "fields": {"dtype": "O", "shape": [1], "data": b""}})
    with pytest.raises(TypeError, match="not storable"):
        to_plain({"x": object()})
