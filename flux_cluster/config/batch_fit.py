"""A fine-tuning run's global batch against its train split, at submit (and again at the job's start).

An epoch is at least one optimizer step, so the train split must hold one global batch. A small folder
(seed 004's users bring 10-20 edit pairs) holds less than a system's default batch (``local``: 16): where
the batch is not the user's choice for this run, the run takes the largest that the split holds, saying
so in one line; where it is (``--set``, a sweep's grid or the system's ``benchmarks.<workload>:`` section),
one line names values that work. The flux1 workload never comes here: its batch is part of the
benchmark. No torch here.
"""

from pydantic import BaseModel, ConfigDict

from flux_cluster.errors import FluxClusterError

BATCH_KEYS = ("train.global_batch_size", "train.micro_batch_size")


class BatchFit(BaseModel):
    """The batch a fine-tuning run took because its train split holds less than the configured one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train_samples: int
    """Samples in the train split (its Energon metadata)."""
    ranks: int
    configured_global: int
    """The global batch the system's train section (or its default) gave."""
    configured_micro: int
    global_batch: int
    """What the split holds (largest_batch)."""
    micro_batch: int

    def describe(self) -> str:
        accumulation = _steps(self.global_batch, self.micro_batch, self.ranks)
        return (
            f"batch: the train split holds {self.train_samples} samples, fewer than the default global "
            f"batch {self.configured_global}: this run takes global batch {self.global_batch} (micro-batch "
            f"{self.micro_batch} x {self.ranks} ranks{accumulation}); set train.global_batch_size and "
            "train.micro_batch_size to choose"
        )


def largest_batch(train_samples: int, ranks: int, micro_batch: int) -> tuple[int, int] | None:
    """(global batch, micro-batch) the split holds: the micro-batch kept where one of each rank fits (the
    most micro-batch x ranks steps the split holds: memory was sized for it), else each rank's whole share
    as one micro-batch; None when the split has fewer samples than ranks."""
    share = train_samples // ranks
    if share < 1:
        return None
    if micro_batch <= share:
        step = micro_batch * ranks
        return train_samples // step * step, micro_batch
    return share * ranks, share


def fit_batch(
    train_samples: int, ranks: int, global_batch: int, micro_batch: int, chosen: str | None
) -> BatchFit | None:
    """None where the split holds one global batch; else the batch to take instead (chosen None: the
    configured batch is a default), or one line naming values that work (chosen: where the user set it,
    e.g. '--set')."""
    if train_samples >= global_batch:
        return None
    split = f"the train split has {train_samples} samples"
    fit = largest_batch(train_samples, ranks, micro_batch)
    if fit is None:
        raise FluxClusterError(
            f"train.global_batch_size: {split}, fewer than the {ranks} ranks (each takes at least one a "
            "step); encode more images or run on fewer GPUs (nodes, gpus_per_node)"
        )
    if chosen is not None:
        raise FluxClusterError(
            f"train.global_batch_size: {split}, fewer than one global batch ({global_batch} = micro-batch "
            f"{micro_batch} x {ranks} ranks{_steps(global_batch, micro_batch, ranks)}, from {chosen}): "
            f"set at most {fit[0]}, e.g. --set train.micro_batch_size={fit[1]} "
            f"--set train.global_batch_size={fit[0]}"
        )
    return BatchFit(
        train_samples=train_samples,
        ranks=ranks,
        configured_global=global_batch,
        configured_micro=micro_batch,
        global_batch=fit[0],
        micro_batch=fit[1],
    )


def _steps(global_batch: int, micro_batch: int, ranks: int) -> str:
    steps = global_batch // (micro_batch * ranks)
    return f" x {steps} accumulation steps" if steps > 1 else ""
