"""Resolve a system's ``train`` section against its workload file into the plan every rank runs.

Resolution happens once, at submit time, so a bad combination (no preset for the batch size, a batch
that does not split over the ranks) is a one-line error before anything is queued. No torch here.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from flux_cluster.config.batch_fit import BatchFit, fit_batch
from flux_cluster.config.schema import SystemConfig
from flux_cluster.config.section import SECTION
from flux_cluster.config.training import FluxPrecision, HfPrecision, TrainConfig
from flux_cluster.errors import FluxClusterError
from flux_cluster.mlperf_rules import closed_division_deviations
from flux_cluster.resources import benchmarks_dir


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a FluxTransformer2DModel that determine its cost (flux_cluster/training/flops.py)."""

    hidden: int
    double_blocks: int
    single_blocks: int
    in_channels: int = 64
    text_dim: int = 4096
    """T5 hidden size (joint_attention_dim)."""
    pooled_dim: int = 768
    """CLIP pooled size (pooled_projection_dim)."""
    mlp_ratio: float = 4.0
    timestep_dim: int = 256
    """Sinusoidal timestep embedding size fed to the time MLP."""
    head_dim: int = 128
    """Attention head size (each q/k RMSNorm holds one weight per channel of a head)."""

    @property
    def parameters(self) -> int:
        """The parameter count of diffusers' FluxTransformer2DModel of this shape (no guidance embedder),
        counted from its layers: what FSDP gathers and reduces every step."""
        d, h, r = self.hidden, self.head_dim, int(self.mlp_ratio)
        # each stream: adaLN (6 d), q k v and out (4 d), MLP (r d in, r d out); 4 q/k norms
        double = 2 * (6 * d * d + 6 * d) + 2 * 4 * (d * d + d) + 2 * (2 * r * d * d + r * d + d) + 4 * h
        # adaLN (3 d), q k v (3 d), MLP in (r d), the fused out ((1 + r) d -> d); 2 q/k norms
        single = (3 + 3 + r) * (d * d + d) + (1 + r) * d * d + d + 2 * h
        root = (
            (self.in_channels + 1) * d  # x_embedder
            + (self.text_dim + 1) * d  # context_embedder
            + (self.timestep_dim + 1) * d
            + (d + 1) * d  # time MLP
            + (self.pooled_dim + 1) * d
            + (d + 1) * d  # pooled-text MLP
            + (d + 1) * 2 * d  # norm_out's modulation
            + (d + 1) * self.in_channels  # proj_out
        )
        return self.double_blocks * double + self.single_blocks * single + root


class _Strict(BaseModel):
    model_config = SECTION


class MlperfFacts(_Strict):
    global_batch_size: int = Field(ge=1)
    """The reference's global batch, for a system that sets none."""
    eval_interval_samples: int = Field(ge=1)
    quality_target: float = Field(gt=0)
    train_samples: int = Field(ge=1)
    eval_samples: int = Field(ge=1)
    max_samples: int = Field(ge=1)


class BatchPreset(_Strict):
    learning_rate: float = Field(gt=0)
    warmup_steps: int = Field(ge=0)


class ModelArgs(_Strict):
    """The FluxTransformer2DModel arguments a preset sets (the rest keep diffusers' defaults)."""

    num_layers: int = Field(ge=0)
    num_single_layers: int = Field(ge=0)
    attention_head_dim: int = Field(ge=2)
    num_attention_heads: int = Field(ge=1)
    joint_attention_dim: int = Field(ge=1)
    pooled_projection_dim: int = Field(ge=1)
    axes_dims_rope: tuple[int, int, int]
    in_channels: int = 64
    guidance_embeds: bool = False
    """True for guidance-distilled checkpoints (FLUX.1-dev), which also take a guidance value."""

    @classmethod
    def of(cls, model_config: Any) -> "ModelArgs":
        """The arguments a built or loaded model really has (a pretrained one need not match its preset)."""
        return cls(**{name: model_config[name] for name in cls.model_fields})

    @property
    def hidden(self) -> int:
        return self.attention_head_dim * self.num_attention_heads

    def shape(self) -> ModelShape:
        return ModelShape(
            hidden=self.hidden,
            double_blocks=self.num_layers,
            single_blocks=self.num_single_layers,
            in_channels=self.in_channels,
            text_dim=self.joint_attention_dim,
            pooled_dim=self.pooled_projection_dim,
            head_dim=self.attention_head_dim,
        )


class FinetuneFacts(_Strict):
    """A fine-tuning workload's defaults: passes over the data, not a quality target, end the run."""

    epochs: int = Field(ge=1)
    learning_rate: dict[Literal["lora", "finetune", "prodigy"], float]
    """Default peak learning rate by train.mode, and for the prodigy optimizer (which scales it itself)."""
    warmup_steps: int = Field(ge=0)


WorkloadKind = Literal["mlperf", "finetune", "hf"]


class Workload(_Strict):
    kind: WorkloadKind = "mlperf"
    mlperf: MlperfFacts | None = None
    finetune: FinetuneFacts | None = None
    hf: FinetuneFacts | None = None
    """Kind 'hf': a Hugging Face model (the system's hf section) fine-tuned for epochs, as kind finetune."""
    batch_presets: dict[int, BatchPreset] = {}
    models: dict[str, ModelArgs] = {}
    """Model shape presets; a fine-tuning workload without its own uses flux1's (a pretrained checkpoint
    brings its own shape anyway)."""

    @model_validator(mode="after")
    def _sections(self) -> "Workload":
        if getattr(self, self.kind) is None:
            raise ValueError(f"a workload of kind {self.kind!r} needs a {self.kind!r} section")
        return self


class MicroBatchChoice(_Strict):
    """How train.micro_batch_size 'auto' chose (flux_cluster/training/batch_choice.py), at submit."""

    micro_batch: int
    share: int
    """The per-rank share of the global batch (global_batch_size / ranks): the choice divides it."""
    checkpointing: str
    """The activation checkpointing mode the choice assumes, at flux1's 256 image and 256 text tokens;
    checkpointing 'auto' re-chooses at the job's start from the dataset's own tokens (the same mode at
    256 and 256)."""
    estimate_gb: float
    """The estimated peak per GPU at micro_batch under checkpointing."""
    budget_gb: float
    """The GPU's memory less checkpointing 'auto''s headroom."""
    floor: int
    """The least 'auto' takes while anything that large fits: the largest divisor of the share up to the
    default micro-batch (16)."""

    def describe(self) -> str:
        over = self.estimate_gb > self.budget_gb
        below = self.micro_batch < self.floor
        return (
            f"micro-batch auto -> {self.micro_batch} (of {self.share} per rank) with checkpointing "
            f"{self.checkpointing}: estimated peak {self.estimate_gb:.1f} GB per GPU, "
            f"{'over' if over else 'within'} {self.budget_gb:.1f} GB"
            + (f"; below {self.floor}: nothing larger fits in any mode" if below else "")
        )


class TrainingPlan(_Strict):
    """Everything the ranks need beyond the system config, fully resolved."""

    train: TrainConfig
    """The system's train section with every None filled in (for fine-tuning: eval_every_steps, max_samples
    and target may stay None: evaluation every epoch, the epochs end the run)."""
    model_args: ModelArgs
    mlperf: MlperfFacts | None
    """The MLPerf facts (kind 'mlperf' workloads only)."""
    kind: WorkloadKind = "mlperf"
    world_size: int
    dp_shard: int
    dp_replicate: int
    grad_accum_steps: int
    workload_file: str
    micro_batch_auto: MicroBatchChoice | None = None
    """How train.micro_batch_size 'auto' chose the micro-batch in train (None: set in the config)."""
    batch_fit: BatchFit | None = None
    """Fine-tuning: the batch the run took because its train split holds less than the configured one
    (fit_to_split, at submit or at the job's start; None: the configured batch)."""
    batch_default: bool = False
    """The batch is the system's default, not the run's choice (submit sets it for a train job): a
    fine-tuning job fits it to its train split (fit_to_split) where submit could not read the split."""

    @property
    def global_batch_size(self) -> int:
        assert self.train.global_batch_size is not None
        return self.train.global_batch_size

    @property
    def learning_rate(self) -> float:
        assert self.train.learning_rate is not None
        return self.train.learning_rate

    @property
    def warmup_steps(self) -> int:
        assert self.train.warmup_steps is not None
        return self.train.warmup_steps

    @property
    def fine_tuning(self) -> bool:
        """Epochs over the user's data end the run (no quality target)."""
        return self.kind in ("finetune", "hf")

    @property
    def epochs(self) -> int:
        assert self.train.epochs is not None
        return self.train.epochs


def load_workload(name: str) -> tuple[Workload, Path]:
    path = benchmarks_dir() / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in benchmarks_dir().glob("*.yaml")))
        raise FluxClusterError(f"train.benchmark: no workload file {path} (known: {known})")
    try:
        return Workload.model_validate(yaml.safe_load(path.read_text())), path
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(p) for p in error["loc"])
        raise FluxClusterError(f"{path}: {key}: {error['msg']}") from None


def _with(config: TrainConfig, **values: Any) -> TrainConfig:
    return config.model_copy(update={k: v for k, v in values.items() if getattr(config, k) is None})


def resolve_training(system: SystemConfig) -> TrainingPlan:
    """The system's train section filled from its workload file and checked against its ranks."""
    train = system.train
    workload, path = load_workload(train.benchmark)
    if workload.kind == "hf":
        return _resolve_hf(system, workload, path)
    _check_flux_only(train, path)
    if workload.kind == "finetune":
        return _resolve_finetune(system, workload, path)
    assert workload.mlperf is not None
    world = system.nodes * system.gpus_per_node
    gbs, mbs = train.global_batch_size or workload.mlperf.global_batch_size, _micro_batch(train)
    _check_split(gbs, mbs, world)
    preset = workload.batch_presets.get(gbs)
    if preset is None and (train.learning_rate is None or train.warmup_steps is None):
        sizes = ", ".join(map(str, sorted(workload.batch_presets)))
        raise FluxClusterError(
            f"train.global_batch_size: no preset for {gbs} in {path.name} (presets: {sizes}); "
            "set train.learning_rate and train.warmup_steps"
        )
    dp_shard = _dp_shard(system, world)
    filled = _with(
        train,
        global_batch_size=gbs,
        learning_rate=preset.learning_rate if preset else None,
        warmup_steps=preset.warmup_steps if preset else None,
        eval_every_steps=math.ceil(workload.mlperf.eval_interval_samples / gbs),
        eval_batch_size=mbs,
        max_samples=workload.mlperf.max_samples,
        target=workload.mlperf.quality_target,
    )
    return TrainingPlan(
        train=filled,
        model_args=_model_args(train.model, workload, path),
        mlperf=workload.mlperf,
        world_size=world,
        dp_shard=dp_shard,
        dp_replicate=world // dp_shard,
        grad_accum_steps=gbs // (mbs * world),
        workload_file=path.name,
    )


JOB_CHOSEN = "the run's config"
"""Where a chosen batch came from, as the job (which reads only the run's config) names it."""


def fit_to_split(
    system: SystemConfig, plan: TrainingPlan, train_samples: int | None, chosen: str | None
) -> tuple[SystemConfig, TrainingPlan]:
    """A fine-tuning train job's system and plan with a global batch its train split holds
    (config/batch_fit.py), the same at submit and at the job's start: unchanged where the split holds one
    (or its size is unknown: train_samples None); where the batch is the default (chosen None), the
    largest batch the split holds, re-resolved and recorded (plan.batch_fit); where the run chose it
    (chosen: where from), one line naming values that work. The plan records batch_default either way."""
    plan = plan.model_copy(update={"batch_default": chosen is None})
    if not plan.fine_tuning or train_samples is None:
        return system, plan
    fit = fit_batch(
        train_samples, plan.world_size, plan.global_batch_size, plan.train.micro_batch_size, chosen
    )
    if fit is None:
        return system, plan
    batch = {"global_batch_size": fit.global_batch, "micro_batch_size": fit.micro_batch}
    system = system.model_copy(update={"train": system.train.model_copy(update=batch)})
    update = {"micro_batch_auto": plan.micro_batch_auto, "batch_fit": fit, "batch_default": True}
    return system, resolve_training(system).model_copy(update=update)


def _resolve_finetune(system: SystemConfig, workload: Workload, path: Path) -> TrainingPlan:
    """A fine-tuning workload: a pretrained checkpoint, epochs over the user's data, no batch presets."""
    train = system.train
    assert workload.finetune is not None
    if train.mode == "pretrain":
        raise FluxClusterError(
            f"train.mode: 'pretrain' does not fine-tune; workload {path.name} needs 'lora' or 'finetune' "
            "(and train.pretrained_path)"
        )
    rates = workload.finetune.learning_rate
    rate = rates["prodigy"] if train.optimizer == "prodigy" else rates[train.mode]
    filled, world = _for_epochs(system, workload.finetune, rate)
    return _epochs_plan(filled, world, _dp_shard(system, world), "finetune", workload, path)


def _for_epochs(system: SystemConfig, facts: FinetuneFacts, learning_rate: float) -> tuple[TrainConfig, int]:
    """The train section of a workload that runs for epochs, filled (one micro-batch per rank unless set,
    the workload's rate, warmup and epochs), and the ranks."""
    train = system.train
    world = system.nodes * system.gpus_per_node
    mbs = _micro_batch(train)
    gbs = train.global_batch_size or mbs * world
    _check_split(gbs, mbs, world)
    filled = _with(
        train,
        global_batch_size=gbs,
        learning_rate=learning_rate,
        warmup_steps=facts.warmup_steps,
        epochs=facts.epochs,
        eval_batch_size=mbs,
    )
    return filled, world


def _epochs_plan(
    filled: TrainConfig, world: int, dp_shard: int, kind: WorkloadKind, workload: Workload, path: Path
) -> TrainingPlan:
    assert filled.global_batch_size is not None
    return TrainingPlan(
        train=filled,
        model_args=_model_args(filled.model, workload, path),
        mlperf=None,
        kind=kind,
        world_size=world,
        dp_shard=dp_shard,
        dp_replicate=world // dp_shard,
        grad_accum_steps=filled.global_batch_size // (filled.micro_batch_size * world),
        workload_file=path.name,
    )


def _check_flux_only(train: TrainConfig, path: Path) -> None:
    """The FLUX workloads refuse the hf workload's values in one line."""
    if train.precision not in get_args(FluxPrecision):
        raise FluxClusterError(
            f"train.precision: {train.precision!r} is for train.benchmark hf; workload {path.name} takes "
            f"{' or '.join(get_args(FluxPrecision))}"
        )
    if train.parallel is not None:
        raise FluxClusterError(
            f"train.parallel: {train.parallel!r} is for train.benchmark hf; workload {path.name} always "
            "trains with FSDP2 (train.dp_shard sets HSDP)"
        )


def _resolve_hf(system: SystemConfig, workload: Workload, path: Path) -> TrainingPlan:
    """A Hugging Face model fine-tuned for epochs: the defaults the seed's benchmark uses (fp32, DDP, all
    weights) where the system leaves them unset."""
    train, hf, explicit = system.train, system.hf, system.train.model_fields_set
    assert workload.hf is not None
    for key, value, expected in (
        ("model", hf.model, "a local model folder (save_pretrained)"),
        (
            "task",
            hf.task,
            "text-classification, causal-lm or image-classification (hf.model has no config.json here "
            "whose architecture would say which)",
        ),
        ("data", hf.data, "a local dataset path or 'synthetic'"),
    ):
        if value is None:
            raise FluxClusterError(f"hf.{key}: workload {path.name} needs it: {expected}")
    mode = train.mode if "mode" in explicit else "finetune"
    if mode == "pretrain":
        raise FluxClusterError(
            f"train.mode: workload {path.name} takes 'finetune' or 'lora' (got 'pretrain')"
        )
    precision = train.precision if "precision" in explicit else "fp32"
    if precision not in get_args(HfPrecision):
        raise FluxClusterError(
            f"train.precision: {precision!r} is for the FLUX workloads; workload {path.name} takes "
            f"{', '.join(get_args(HfPrecision))}"
        )
    if train.optimizer != "adamw":
        raise FluxClusterError(
            f"train.optimizer: workload {path.name} takes 'adamw' (got {train.optimizer!r})"
        )
    parallel = train.parallel or "ddp"
    if parallel == "dp" and system.nodes != 1:
        raise FluxClusterError(
            f"train.parallel: 'dp' is one process driving one node's GPUs; got nodes {system.nodes}: "
            "use 'ddp' or 'fsdp' across nodes"
        )
    filled, world = _for_epochs(system, workload.hf, workload.hf.learning_rate[mode])
    filled = filled.model_copy(
        update={
            "mode": mode,
            "precision": precision,
            "parallel": parallel,
            # empty: the model architecture's default targets (flux_cluster/hf/model.py)
            "lora_targets": train.lora_targets if "lora_targets" in explicit else [],
        }
    )
    return _epochs_plan(filled, world, world, "hf", workload, path)  # hf's FSDP shards over every rank


def _micro_batch(train: TrainConfig) -> int:
    """train.micro_batch_size; 'auto' needs the memory estimate (torch), so submit resolves it first."""
    if train.micro_batch_size == "auto":
        raise FluxClusterError(
            "train.micro_batch_size: 'auto' is resolved by 'flux-cluster submit' (or preflight); "
            "set a number to resolve the config here"
        )
    return train.micro_batch_size


def _check_split(gbs: int, mbs: int, world: int) -> None:
    if gbs % (mbs * world):
        raise FluxClusterError(
            f"train.global_batch_size: {gbs} does not split over {world} ranks x micro_batch_size {mbs}; "
            f"expected a multiple of {mbs * world}"
        )


def _dp_shard(system: SystemConfig, world: int) -> int:
    dp_shard = system.train.dp_shard or system.gpus_per_node
    if world % dp_shard:
        raise FluxClusterError(f"train.dp_shard: {dp_shard} does not divide the {world} ranks")
    return dp_shard


def _model_args(name: str, workload: Workload, path: Path) -> ModelArgs:
    models = workload.models or load_workload("flux1")[0].models
    if name not in models:
        raise FluxClusterError(f"train.model: {name!r} is not a model of {path.name}")
    return models[name]


def run_deviations(job: Mapping[str, Any]) -> list[str]:
    """The reasons a run is non-conforming, from its config.yaml's ``job`` section ([] when it
    conforms or is no training run). Loads the run's workload file (configs/benchmarks/)."""
    training = job.get("training")
    if not training:
        return []
    workload, _ = load_workload(training["train"]["benchmark"])
    if workload.kind != "mlperf" or not training.get("mlperf"):
        return [f"fine-tuning workload {training['train']['benchmark']!r}: no MLPerf result"]
    found = closed_division_deviations(training["train"], training["mlperf"], workload.batch_presets.keys())
    return [d.reason for d in found]
