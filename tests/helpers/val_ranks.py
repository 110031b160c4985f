"""Under torchrun (2 ranks, gloo): the validation loss of a fixed model over each rank's val part."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from data_prep.format import DIMS
from data_prep.loader import val_loader
from flux_cluster.training.rectified_flow import validation_loss

sys.path.insert(0, str(Path(__file__).parent.parent))
from test_validation import FixedModel


def main(root: Path, out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = val_loader(root, batch_size=4, rank=rank, world_size=world, dims=DIMS["tiny"])
    loss, samples = validation_loss(FixedModel(), batches, torch.device("cpu"))
    (out / f"rank{rank}.json").write_text(json.dumps({"loss": loss, "samples": samples}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
