"""Run under torchrun (2 ranks, gloo): read val and a few train batches through the Energon loader and
write what each rank saw to OUT/rank<r>.json, for tests/integration/test_loader.py to check."""

import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from flux_cluster.data.format import DIMS
from flux_cluster.data.loader import train_loader, val_loader


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().view(torch.uint16).numpy().tobytes()).hexdigest()


def main(root: Path, out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    val = []
    for batch in val_loader(root, batch_size=3, rank=rank, world_size=world, dims=DIMS["tiny"]):
        for i, key in enumerate(batch.keys):
            val.append({"key": key, "timestep": int(batch.timestep[i]), "mean": digest(batch.mean[i])})
    seen = [None] * world
    dist.all_gather_object(seen, [v["key"] for v in val])
    loader = train_loader(root, batch_size=4, rank=rank, world_size=world, seed=7, dims=DIMS["tiny"])
    train = [batch.keys for _, batch in zip(range(3), loader, strict=False)]
    json.dump(
        {"rank": rank, "val": val, "train": train, "all_val_keys": seen}, (out / f"rank{rank}.json").open("w")
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
