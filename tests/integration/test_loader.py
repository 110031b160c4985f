"""The Energon loader over shards made by prepare-data: exact tensors, val coverage across 2 real ranks,
CFG dropout, and a restored loader position."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from data_helpers import make_energon_root, run_two_ranks

from flux_cluster.data.format import DIMS, decode_tensor
from flux_cluster.data.loader import load_empty_encodings, train_loader, val_loader
from flux_cluster.training.checkpoint import to_plain

HELPER = Path(__file__).parents[1] / "helpers" / "load_ranks.py"
TRAIN, VAL = 60, 21  # 21 val samples: the two ranks get unequal parts


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_energon_root(tmp_path_factory.mktemp("loader"), TRAIN, VAL, shard_size=8)


def test_two_ranks_cover_val_exactly_once(root: Path, tmp_path: Path) -> None:
    ranks = run_two_ranks(HELPER, root, tmp_path)
    keys = [v["key"] for rank in ranks for v in rank["val"]]
    assert sorted(keys) == [f"{TRAIN + i:08d}" for i in range(VAL)]
    assert len(set(ranks[0]["all_val_keys"][0]) & set(ranks[0]["all_val_keys"][1])) == 0
    assert all(rank["val"] for rank in ranks), "each rank gets part of val"
    assert sorted(v["timestep"] for v in (x for rank in ranks for x in rank["val"])) == sorted(
        i % 8 for i in range(VAL)
    )
    # distinct data per rank in training
    assert ranks[0]["train"] != ranks[1]["train"]


def test_tensors_equal_the_shard_bytes(root: Path) -> None:
    import tarfile

    with tarfile.open(root / "val" / "shard_000000.tar") as archive:
        members = {m.name: archive.extractfile(m).read() for m in archive}
    batch = next(iter(val_loader(root, batch_size=4, rank=0, world_size=1, dims=DIMS["tiny"])))
    for i, key in enumerate(batch.keys):
        for field, suffix in (("t5", "t5"), ("clip", "clip"), ("mean", "mean"), ("logvar", "logvar")):
            expected = decode_tensor(members[f"{key}.{suffix}.bytes"])
            got = getattr(batch, field)[i]
            assert got.dtype == torch.bfloat16
            assert np.array_equal(got.view(torch.uint16).numpy(), expected)
        assert int(batch.timestep[i]) == json.loads(members[f"{key}.json"])["timestep"]


def test_cfg_dropout_uses_the_empty_encodings(root: Path) -> None:
    empty_t5, empty_clip = load_empty_encodings(root)
    always = train_loader(
        root, batch_size=4, rank=0, world_size=1, seed=1, cfg_dropout=1.0, dims=DIMS["tiny"]
    )
    batch = next(iter(always))
    assert bool(batch.caption_dropped.all())
    assert torch.equal(batch.t5[0], empty_t5) and torch.equal(batch.clip[0], empty_clip)
    never = train_loader(root, batch_size=4, rank=0, world_size=1, seed=1, cfg_dropout=0.0, dims=DIMS["tiny"])
    batch = next(iter(never))
    assert not bool(batch.caption_dropped.any())
    assert not torch.equal(batch.clip[0], empty_clip)
    default = train_loader(root, batch_size=10, rank=0, world_size=1, seed=1, dims=DIMS["tiny"])
    dropped = sum(int(b.caption_dropped.sum()) for _, b in zip(range(30), default, strict=False))
    assert 10 <= dropped <= 55, f"p=0.1 over 300 samples dropped {dropped}"


def test_restored_loader_continues_in_a_fresh_process(root: Path, tmp_path: Path) -> None:
    """As after a requeue: another process, which has not used any other loader before, restores it."""
    # This process has used another loader first (another seed): that must not change this one's dropout.
    next(
        iter(
            train_loader(
                root, batch_size=4, rank=0, world_size=1, seed=99, cfg_dropout=0.5, dims=DIMS["tiny"]
            )
        )
    )
    loader = train_loader(
        root, batch_size=4, rank=0, world_size=1, seed=5, cfg_dropout=0.5, dims=DIMS["tiny"]
    )
    iterator = iter(loader)
    for _ in range(4):
        next(iterator)
    # As a checkpoint stores it: plain data, read back with weights_only=True.
    torch.save(to_plain(loader.save_state_rank()), tmp_path / "state.pt")
    expected = [next(iterator) for _ in range(6)]
    code = (
        "import json, sys, torch; from pathlib import Path; from flux_cluster.data.format import DIMS; "
        "from flux_cluster.data.loader import train_loader; "
        "from flux_cluster.training.checkpoint import from_plain; "
        "loader = train_loader(Path(sys.argv[1]), batch_size=4, rank=0, world_size=1, seed=5, "
        "cfg_dropout=0.5, dims=DIMS['tiny']); "
        "loader.restore_state_rank(from_plain(torch.load(sys.argv[2], weights_only=True))); "
        "batches = [b for _, b in zip(range(6), loader)]; "
        "print(json.dumps([[b.keys, b.caption_dropped.tolist()] for b in batches]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(root), str(tmp_path / "state.pt")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got == [[b.keys, b.caption_dropped.tolist()] for b in expected]


def test_restored_loader_continues_where_the_saved_one_stopped(root: Path) -> None:
    def make() -> object:
        return train_loader(root, batch_size=4, rank=0, world_size=1, seed=5, dims=DIMS["tiny"])

    loader = make()
    iterator = iter(loader)
    for _ in range(4):
        next(iterator)
    state = loader.save_state_rank()
    expected = [next(iterator) for _ in range(5)]
    restored = make()
    restored.restore_state_rank(state)
    again = [b for _, b in zip(range(5), restored, strict=False)]
    assert [b.keys for b in again] == [b.keys for b in expected]
    assert [b.caption_dropped.tolist() for b in again] == [b.caption_dropped.tolist() for b in expected]
    assert all(torch.equal(a.t5, b.t5) for a, b in zip(again, expected, strict=True))
