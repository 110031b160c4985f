"""Under torchrun (2 ranks, gloo): the validation loss of a fixed model over each rank's val part.

The model's forward is a collective, as a sharded model's is (FSDP all-gathers its weights), so ranks
that do not step through val together hang here. FLUX_TEST_VAL_BATCH sets the val batch size (4)."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from flux_cluster.data.format import DIMS
from flux_cluster.data.loader import val_loader
from flux_cluster.training.rectified_flow import validation_loss

# tests/ (data_helpers) and tests/integration/ (test_validation), as pytest would put them on the path
sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from test_validation import FixedModel


class CollectiveModel(FixedModel):
    forwards = 0

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(torch.ones(1))
        self.forwards += 1
        return super().forward(*inputs)


def main(root: Path, out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    batch_size = int(os.environ.get("FLUX_TEST_VAL_BATCH", "4"))
    batches = val_loader(root, batch_size=batch_size, rank=rank, world_size=world, dims=DIMS["tiny"])
    model = CollectiveModel()
    loss, samples = validation_loss(
        model,
        batches,
        torch.device("cpu"),
        spare=lambda: next(iter(val_loader(root, batch_size=1, rank=0, world_size=1, dims=DIMS["tiny"]))),
    )
    record = {"loss": loss, "samples": samples, "forwards": model.forwards}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
