"""A fine-tuning run's global batch against its train split: at submit where this host reads the split,
else at the job's start (the same function, the same line in the job's log).

An epoch is at least one optimizer step, so the train split must hold one global batch. A small folder
(seed 004's users bring 10-20 edit pairs) holds less than a system's default batch (``local``: 16).
Where the batch is the system's default (its ``train:`` section, a site's own system file included, or
the workload's one micro-batch per rank), the train job takes the largest batch the split holds
(largest_batch), saying so in one line; where the run chose it (``--set``, a sweep's grid, the system's
``benchmarks.<workload>:`` section), one line states the largest global batch the split holds and names
values that work. A throughput job measures the batch as configured and is never fitted; the flux1
workload never comes here (its batch is part of the benchmark). No torch here.
"""

from pydantic import BaseModel, ConfigDict

from flux_cluster.errors import FluxClusterError

BATCH_KEYS = ("train.global_batch_size", "train.micro_batch_size")


class BatchFit(BaseModel):
    """The batch a fine-tuning run took because its train split holds less than the configured one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train_samples: int
    """Samples in the train split (its Energon metadata, or the hf workload's loaded split)."""
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


def largest_batch(
    train_samples: int, ranks: int, micro_batch: int, accumulation: int = 1
) -> tuple[int, int] | None:
    """(global batch, micro-batch) a default batch is fitted to: the largest global batch up to
    train_samples that splits as micro-batch x ranks x steps with a micro-batch of at most micro_batch
    (memory was sized for it) and at most ``accumulation`` steps (the configured batch's: none unless it
    had some, so never micro-batch 1 x 11 steps); among equal global batches, the largest micro-batch.
    None when the split has fewer samples than ranks."""
    best: tuple[int, int] | None = None
    for micro in range(min(micro_batch, train_samples // ranks), 0, -1):
        steps = min(accumulation, train_samples // (micro * ranks))
        if best is None or micro * ranks * steps > best[0]:
            best = (micro * ranks * steps, micro)
    return best


def fit_batch(
    train_samples: int, ranks: int, global_batch: int, micro_batch: int, chosen: str | None
) -> BatchFit | None:
    """None where the split holds one global batch; else the batch to take instead (chosen None: the
    configured batch is the system's default), or, where the run chose it (chosen: where, e.g. '--set'),
    one line stating the largest global batch the split holds and values that work."""
    if train_samples >= global_batch:
        return None
    split = f"the train split has {train_samples} samples"
    accumulation = global_batch // (micro_batch * ranks)
    fit = largest_batch(train_samples, ranks, micro_batch, accumulation)
    if fit is None:
        raise FluxClusterError(
            f"train.global_batch_size: {split}, fewer than the {ranks} ranks (each takes at least one a "
            "step); encode more images or run on fewer GPUs (nodes, gpus_per_node)"
        )
    if chosen is not None:
        raise FluxClusterError(
            f"train.global_batch_size: {split}, fewer than one global batch ({global_batch} = micro-batch "
            f"{micro_batch} x {ranks} ranks{_steps(global_batch, micro_batch, ranks)}, from {chosen}): "
            f"{_what_works(train_samples, ranks, micro_batch)}"
        )
    return BatchFit(
        train_samples=train_samples,
        ranks=ranks,
        configured_global=global_batch,
        configured_micro=micro_batch,
        global_batch=fit[0],
        micro_batch=fit[1],
    )


def _what_works(train_samples: int, ranks: int, micro_batch: int) -> str:
    """The largest global batch the split holds (a multiple of the ranks: one micro-batch per rank of
    each rank's share), and the largest that keeps the run's micro-batch where one per rank fits."""
    share = train_samples // ranks
    most = share * ranks
    text = (
        f"set at most {most} (micro-batch x {ranks} ranks x accumulation steps), e.g. "
        f"--set train.micro_batch_size={share} --set train.global_batch_size={most}"
    )
    step = micro_batch * ranks
    kept = train_samples // step * step
    if 0 < kept < most:
        text += (
            f"; keeping micro-batch {micro_batch}: --set train.micro_batch_size={micro_batch} "
            f"--set train.global_batch_size={kept}"
        )
    return text


def _steps(global_batch: int, micro_batch: int, ranks: int) -> str:
    steps = global_batch // (micro_batch * ranks)
    return f" x {steps} accumulation steps" if steps > 1 else ""
