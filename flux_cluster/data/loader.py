"""The Energon loader training reads: one task encoder for the flux1 shards.

It decodes the bf16-as-uint16 ``np.save`` members into bf16 tensors, applies classifier-free-guidance
dropout (the caption encodings replaced by the empty-prompt encodings with probability p) in a way
Energon can restore, and stacks samples into batches. Train loaders are savable, so a checkpoint holds
the loader position; val loaders give each rank a disjoint part, covering every sample exactly once.
"""

import json
import os
import random
import signal
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from megatron.energon import (
    Batch,
    Cooker,
    DefaultTaskEncoder,
    Sample,
    SavableDataLoader,
    WorkerConfig,
    basic_sample_keys,
    edataclass,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron.energon.task_encoder.base import stateless

from flux_cluster.data.format import (
    CONTROL_MEMBER,
    EMPTY_DIR,
    EMPTY_FILES,
    TENSOR_COLUMNS,
    Dims,
    FormatError,
    decode_tensor,
)

# Energon's loaders ask for pinned memory; on CPU-only hosts torch warns once per loader.
warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true but no accelerator.*")

DEFAULT_CFG_DROPOUT = 0.1
NO_TIMESTEP = -1
_MEMBER_OF = {column: suffix for column, suffix in TENSOR_COLUMNS.items()}


@edataclass
class FluxSample(Sample):
    t5: torch.Tensor
    """T5 encodings [tokens, dim], bf16."""
    clip: torch.Tensor
    """Pooled CLIP encoding [dim], bf16."""
    mean: torch.Tensor
    """Autoencoder latent mean [16, H, W], bf16."""
    logvar: torch.Tensor
    """Autoencoder latent log-variance [16, H, W], bf16."""
    timestep: int
    """Val: the sample's timestep index 0..7 (t = timestep / 8); train: -1."""
    caption_dropped: bool = False
    control: torch.Tensor | None = None
    """Edit pairs: the control image's latent mean [16, H, W], bf16 (FLUX Kontext's condition)."""


@edataclass
class FluxBatch(Batch):
    keys: list[str]
    t5: torch.Tensor
    clip: torch.Tensor
    mean: torch.Tensor
    logvar: torch.Tensor
    timestep: torch.Tensor
    caption_dropped: torch.Tensor
    control: torch.Tensor | None = None


def _tensor(data: bytes, shape: tuple[int, ...] | None) -> torch.Tensor:
    bits = decode_tensor(data, shape)
    return torch.from_numpy(np.array(bits, copy=True)).view(torch.bfloat16)


def load_empty_encodings(root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(t5 [tokens, dim], clip [dim]) in bf16, from the float16 files with a leading batch dim."""
    t5, clip = (torch.from_numpy(np.load(root / EMPTY_DIR / name)) for name in EMPTY_FILES)
    return t5[0].to(torch.bfloat16), clip[0].to(torch.bfloat16)


def _ignore_job_signals(worker_init: Callable[[int], None] | None) -> Callable[[int], None]:
    """A worker_init_fn that keeps loader workers alive through the signals meant for the job. Slurm
    signals every process of a step (preemption, 'runs requeue', scancel): torch's workers would die
    of SIGTERM, their rank's next loader call would raise, and the checkpoint taken on that signal
    (which asks the workers for their state) would be lost. As torch's own handler does, a SIGTERM from
    the worker's parent (the rank, shutting the loader down) still ends the worker."""

    def init(worker_id: int) -> None:
        if worker_init is not None:
            worker_init(worker_id)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        parent = os.getppid()
        # Blocked here, so in every thread the worker starts later too; one thread takes each SIGTERM
        # with its sender's pid.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

        def take_sigterm() -> None:
            while True:
                if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
                    os._exit(0)

        threading.Thread(target=take_sigterm, name="sigterm", daemon=True).start()

    return init


class FluxTaskEncoder(DefaultTaskEncoder[FluxSample, FluxSample, FluxBatch, FluxBatch]):
    """Crude shard samples -> FluxSample -> FluxBatch, with CFG dropout on train samples."""

    def __init__(
        self, root: Path, cfg_dropout: float = DEFAULT_CFG_DROPOUT, dims: Dims | None = None
    ) -> None:
        if not 0.0 <= cfg_dropout <= 1.0:
            raise ValueError(f"cfg_dropout {cfg_dropout}: expected a probability in [0, 1]")
        self.cookers = [Cooker(self._cook)]
        super().__init__(batch_type=FluxBatch)
        self.cfg_dropout = cfg_dropout
        self.shapes = dims.shapes() if dims else {}
        self.empty_t5, self.empty_clip = load_empty_encodings(root)

    @stateless
    def _cook(self, crude: dict) -> FluxSample:
        record = crude["json"]  # Energon's default decoder has parsed it already
        if isinstance(record, bytes | str):
            record = json.loads(record)
        tensors = {
            column: _tensor(crude[suffix], self.shapes.get(column)) for column, suffix in _MEMBER_OF.items()
        }
        return FluxSample(
            **basic_sample_keys(crude),
            t5=tensors["t5_encodings"],
            clip=tensors["clip_encodings"],
            mean=tensors["mean"],
            logvar=tensors["logvar"],
            timestep=int(record.get("timestep", NO_TIMESTEP)),
            control=_tensor(crude[CONTROL_MEMBER], self.shapes.get("mean"))
            if CONTROL_MEMBER in crude
            else None,
        )

    @stateless
    def encode_sample(self, sample: FluxSample) -> FluxSample:
        # Seeded from (this worker's seed, its sample index), both restored with the loader state, so a
        # resumed run drops the same captions. (Energon's restore_seeds caches one seed per process.)
        config = WorkerConfig.active_worker_config
        assert config is not None, "encode_sample runs inside an Energon loader"
        draw = random.Random(config.worker_seed() * 2**40 + self.current_sample_index).random()
        if self.cfg_dropout > 0 and draw < self.cfg_dropout:
            sample.t5 = self.empty_t5
            sample.clip = self.empty_clip
            sample.caption_dropped = True
        return sample

    def batch(self, samples: list[FluxSample]) -> FluxBatch:
        controls = sum(s.control is not None for s in samples)
        if 0 < controls < len(samples):  # data verify refuses such a dataset; one line, not torch.stack(None)
            raise FormatError(
                f"a batch of {', '.join(s.__key__ for s in samples)}: {controls} of {len(samples)} samples "
                f"have a {CONTROL_MEMBER} (edit pairs); expected every sample or none"
            )
        return FluxBatch.from_samples(
            samples,
            keys=[s.__key__ for s in samples],
            t5=torch.stack([s.t5 for s in samples]),
            clip=torch.stack([s.clip for s in samples]),
            mean=torch.stack([s.mean for s in samples]),
            logvar=torch.stack([s.logvar for s in samples]),
            timestep=torch.tensor([s.timestep for s in samples], dtype=torch.long),
            caption_dropped=torch.tensor([s.caption_dropped for s in samples], dtype=torch.bool),
            control=torch.stack([s.control for s in samples]) if controls else None,
        )


def loader_state_classes() -> tuple[type, ...]:
    """The classes a train loader's saved state (save_state_rank) is made of, with or without workers: a
    checkpoint stores them as plain data (flux_cluster.training.checkpoint.to_plain) and rebuilds only
    these."""
    from megatron.energon.flavors.webdataset.sample_loader import SliceState
    from megatron.energon.rng import SystemRngState
    from megatron.energon.savable_loader import (
        SavableDataLoaderState,
        SavableDatasetCheckpoint,
        SavableDatasetState,
    )
    from megatron.energon.state import FlexState

    return (
        SavableDataLoaderState,
        SavableDatasetCheckpoint,
        SavableDatasetState,
        SystemRngState,
        FlexState,
        SliceState,
    )


def train_loader(
    root: Path,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    num_workers: int = 0,
    cfg_dropout: float = DEFAULT_CFG_DROPOUT,
    shuffle_buffer_size: int = 100,
    max_samples_per_sequence: int = 100,
    dims: Dims | None = None,
) -> SavableDataLoader:
    """An endless, shuffled, savable train loader for one data-parallel rank (its state: save_state_rank)."""
    worker_config = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers, seed_offset=seed)
    dataset = get_train_dataset(
        root,
        split_part="train",
        worker_config=worker_config,
        batch_size=batch_size,
        batch_drop_last=True,
        shuffle_buffer_size=shuffle_buffer_size,
        max_samples_per_sequence=max_samples_per_sequence,
        task_encoder=FluxTaskEncoder(root, cfg_dropout, dims),
    )
    loader = get_savable_loader(dataset)
    # Read when the workers start (at the first iter()), after Energon set its own.
    loader.worker_init_fn = _ignore_job_signals(loader.worker_init_fn)
    return loader


def val_loader(
    root: Path, *, batch_size: int, rank: int, world_size: int, num_workers: int = 0, dims: Dims | None = None
) -> torch.utils.data.DataLoader:
    """One pass over this rank's part of val, no dropout; the ranks' parts cover val exactly once."""
    worker_config = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    dataset = get_val_dataset(
        root,
        split_part="val",
        worker_config=worker_config,
        batch_size=batch_size,
        task_encoder=FluxTaskEncoder(root, cfg_dropout=0.0, dims=dims),
    )
    loader = get_loader(dataset)
    loader.worker_init_fn = _ignore_job_signals(loader.worker_init_fn)
    return loader
