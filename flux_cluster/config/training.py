"""The ``train`` section of a system config: how this system runs the training workload.

Every field left at None takes its value from the workload file (``configs/benchmarks/<benchmark>.yaml``):
the learning rate and warmup from the preset of the global batch size, the eval interval from MLPerf's
262,144 samples. ``flux_cluster.config.workload`` resolves the section into a concrete plan at submit
time, and that plan is what the ranks read.
"""

import contextlib
import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from flux_cluster.config.section import SECTION

CHECKPOINT_MODES = ("full", "alternate", "single", "ops", "none")
"""The fixed activation-checkpointing modes; besides them 'auto' and 'ops+N' (ops_whole_blocks)."""
_OPS_WHOLE = re.compile(r"ops\+([1-9][0-9]*)")


def ops_whole_blocks(mode: str) -> int | None:
    """N of a mode 'ops+N' (N blocks checkpointed whole, the rest by ops: block_wrappings), else None."""
    match = _OPS_WHOLE.fullmatch(mode)
    return int(match.group(1)) if match else None


def is_checkpoint_mode(mode: str) -> bool:
    """A mode the training runs as it is: a fixed one (CHECKPOINT_MODES) or 'ops+N'; not 'auto', which
    is resolved to one of them before the training starts."""
    return mode in CHECKPOINT_MODES or ops_whole_blocks(mode) is not None


def _checkpoint_mode(value: str) -> str:
    if value != "auto" and not is_checkpoint_mode(value):
        raise ValueError(f"got {value!r}, expected auto, {', '.join(CHECKPOINT_MODES)} or ops+N (N >= 1)")
    return value


CheckpointMode = Annotated[str, AfterValidator(_checkpoint_mode)]
AttentionBackend = Literal["auto", "flash", "efficient", "cudnn", "math"]
FluxPrecision = Literal["bf16", "fp8"]
HfPrecision = Literal["fp32", "amp-bf16", "amp-fp16"]
Precision = Literal[FluxPrecision, HfPrecision]
"""The FLUX workloads take bf16 | fp8, the hf workload fp32 | amp-bf16 | amp-fp16 (config/workload.py)."""
HfParallel = Literal["ddp", "dp", "fsdp"]
FP8_STATUS = (
    "train.precision fp8 is experimental: 1.16x bf16's samples/s with 'ops+2' and 1.14x with 'ops' on one "
    "H200, 1.16x with full checkpointing on one H100 (compiled, micro-batch 32, 2026-11-27), short of the "
    "1.25x it aims at"
)
"""What 'systems show' and docs/benchmarks.md say of fp8 until a GPU measures it at 1.25x bf16 or more."""
ModelPresetName = Literal["flux-schnell", "proxy", "small", "tiny"]
TrainMode = Literal["pretrain", "finetune", "lora"]
OptimizerName = Literal["adamw", "adamw8bit", "prodigy"]
BasePrecision = Literal["bf16", "fp8", "nf4"]
DEFAULT_CAPTION_DROPOUT = 0.1
DEFAULT_MICRO_BATCH = 16
"""train.micro_batch_size unless set; the least 'auto' takes while anything that large fits."""
ModuleName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.]+$")]


class SyntheticDataConfig(BaseModel):
    model_config = SECTION

    train: int = Field(default=4096, ge=1)
    """Train samples to generate."""
    val: int = Field(default=512, ge=8)
    """Val samples to generate (timesteps 0..7 in turn)."""
    dims: Literal["tiny", "real"] = "tiny"
    """Tensor shapes: 'tiny' for the tiny model, 'real' for the MLPerf shapes."""
    seed: int = 0
    """Seed of the synthetic data."""


class TrainConfig(BaseModel):
    model_config = SECTION

    benchmark: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]+$")] = "flux1"
    """Workload file: configs/benchmarks/<benchmark>.yaml (model shapes, batch-size presets, MLPerf facts)."""
    model: ModelPresetName = "flux-schnell"
    """Model shape preset: 'flux-schnell' (11.9B, the benchmark), 'proxy' (its width, 4+8 blocks: ~2.5B, one
    GPU's throughput at the benchmark's width), 'small' (~0.2B), 'tiny' (tests, CPU)."""
    mode: TrainMode = "pretrain"
    """'pretrain' from random init (the benchmark), 'finetune' all weights of pretrained_path, 'lora' adapters
    on a frozen pretrained_path."""
    pretrained_path: str | None = None
    """Local diffusers checkpoint (a folder with config.json and safetensors, or a pipeline folder with a
    transformer/ subfolder) for finetune and lora. Model hubs are not contacted."""
    optimizer: OptimizerName = "adamw"
    """'adamw' (torch, the benchmark's), 'adamw8bit' (bitsandbytes: 8-bit optimizer state, a quarter of the
    memory) or 'prodigy' (prodigyopt, with its settings for diffusion models: it finds the step size
    itself and learning_rate scales it, so set learning_rate 1.0, prodigy's default; nothing checks it).
    The latter two step each rank's shard of the FSDP2 parameters."""
    lora_init: str | None = None
    """A LoRA safetensors file (diffusers format) to start the adapters from (mode 'lora'); its rank and
    target modules must match lora_rank and lora_targets."""
    epochs: int | None = Field(default=None, ge=1)
    """Fine-tuning workloads: passes over the train split; None takes the workload's default."""
    global_batch_size: int | None = Field(default=None, ge=1)
    """Samples per optimizer step across all ranks (MLPerf's global_batch_size); None takes the workload's:
    flux1 the reference's 512, fine-tuning one micro-batch per rank (no gradient accumulation)."""
    micro_batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = DEFAULT_MICRO_BATCH
    """Samples per rank per forward/backward; the rest of the global batch is gradient accumulation.
    'auto' (opt-in; the flux1 workload on systems with gpu_memory_gb): resolved at submit
    (training/batch_choice.py) to a divisor of the per-rank share of the global batch (global_batch_size /
    ranks). Checkpointing first, micro-batch second: the mode is activation_checkpointing's (for 'auto':
    the least recompute of its order in which a divisor of at least 16 fits), then the micro-batch is the
    largest divisor whose estimated peak under that mode fits 90% of gpu_memory_gb (the headroom
    checkpointing 'auto' leaves). So 'auto' never trades recomputation for a bigger micro-batch, and goes
    below 16 (or the share, if smaller) only when nothing that large fits in any mode, which its line
    then says. The job prints the choice and its estimate at start; systems without gpu_memory_gb refuse
    it in one line."""
    learning_rate: float | None = Field(default=None, gt=0)
    """Peak AdamW learning rate; None takes the preset of global_batch_size."""
    warmup_steps: int | None = Field(default=None, ge=0)
    """Linear warmup steps, constant afterwards; None takes the preset of global_batch_size."""
    eval_every_steps: int | None = Field(default=None, ge=1)
    """Steps between evaluations; None is MLPerf's ceil(262144 / global_batch_size)."""
    eval_batch_size: int | None = Field(default=None, ge=1)
    """Val samples per rank per forward; None uses micro_batch_size."""
    target: float | None = Field(default=None, gt=0)
    """Stop when the validation loss is at or below this; None: the workload's (MLPerf flux1: 0.586;
    fine-tuning: none, the epochs end the run)."""
    max_samples: int | None = Field(default=None, ge=1)
    """Give up (run_stop status 'aborted') after this many training samples; None: the workload's limit."""
    log_every_steps: int = Field(default=10, ge=1)
    """Steps between progress lines and TensorBoard scalars."""
    checkpoint_every_steps: int = Field(default=0, ge=0)
    """Steps between periodic checkpoints; 0 checkpoints only on SIGUSR1/SIGTERM (MLPerf runs do not stop)."""
    checkpoint_every_minutes: float = Field(default=0, ge=0)
    """Minutes of training between periodic checkpoints (rank 0's clock, agreed by all ranks), so a node
    failure or SIGKILL costs at most this; 0: off. The GPU system bases set 30."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Complete checkpoints kept per repeat; older ones are deleted after a new one is committed."""
    checkpoint_dir: str | None = None
    """Where checkpoints go; None: <run dir>/checkpoints (a shared file system on clusters)."""
    activation_checkpointing: CheckpointMode = "auto"
    """Which blocks recompute their activations in the backward pass: 'full' (every block, the reference),
    'alternate' (every other block), 'single' (the single-stream blocks), 'ops' (every block, keeping its
    matmul and attention outputs: only cheap ops are recomputed), 'ops+N' ('ops', but N blocks, the first
    single-stream ones first, checkpointed whole: ~0.9 GB less per block at flux-schnell's width and micro-
    batch 32, for recomputing its matmuls; N >= the block count is 'full'), 'none'. true/false mean full/none.
    'auto': the least recomputation (none, ops, ops+1, ops+2, ... full) whose estimated peak fits 90% of
    the system's gpu_memory_gb at the run's world size and micro-batch (training/memory.py); 'full' on
    systems without gpu_memory_gb. The job prints its choice and the estimate at start."""
    compile: bool = False
    """torch.compile each transformer block (fullgraph)."""
    attention_backend: AttentionBackend = "auto"
    """SDPA kernel: 'auto' (flash, then memory-efficient, then math on GPUs, never cuDNN, whose backward
    failed at FLUX shapes on H100; math on CPU), or exactly one of flash, efficient, cudnn, math."""
    param_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """Dtype of the parameters in compute (FSDP's mixed precision); master weights and gradient reduction
    stay float32."""
    precision: Precision = "bf16"
    """Matmul precision of the transformer blocks: 'bf16' (param_dtype), or 'fp8': torchao float8 training of
    every block's linear layers (dynamic per-tensor scales; e4m3 forward, e5m2 gradients), everything else in
    bf16, as NVIDIA's and AMD's flux1 submissions train. Faster only on GPUs with FP8 matmuls (H100,
    MI300 and newer); CPUs run the same code slowly. Needs param_dtype bfloat16; not with mode 'lora'.
    The hf workload takes 'fp32' (its default when unset), 'amp-bf16' or 'amp-fp16' (torch.autocast over
    fp32 weights; fp16 with a GradScaler) instead."""
    parallel: HfParallel | None = None
    """The hf workload only (FLUX always trains with FSDP2/HSDP): 'ddp' (DistributedDataParallel, one
    process per GPU; the default), 'dp' (torch.nn.DataParallel: ONE process per node drives all its GPUs,
    kept to show what it costs: see flux_cluster/hf/parallel.py) or 'fsdp' (fully_shard per layer)."""
    dp_shard: int | None = Field(default=None, ge=1)
    """Ranks that shard one copy of the model; the copies replicate across the rest (HSDP). None: the GPUs
    of one node, so replicas span nodes; set it to the world size for plain FSDP."""
    loader_workers: int = Field(default=4, ge=0, le=64)
    """Energon loader worker processes per rank (0: load in the training process)."""
    caption_dropout: float | None = Field(default=None, ge=0, le=1)
    """Probability that a train sample's caption encodings are replaced by the empty ones (the T5 and CLIP
    encodings of ''), so the model also learns the unconditional prediction that classifier-free guidance
    needs; None: cfg_dropout, else 0.1."""
    cfg_dropout: float | None = Field(default=None, ge=0, le=1)
    """The older name of caption_dropout (the same setting: dropping captions is what classifier-free
    guidance learns from). Set one of the two, or both to the same value."""
    guidance_scale: float = Field(default=3.5, ge=0)
    """Guidance value fed to guidance-distilled checkpoints (FLUX.1-dev) while training; others ignore it."""
    lora_rank: int = Field(default=16, ge=1, le=4096)
    """LoRA rank (mode 'lora'), at most 4096: past a layer's width (FLUX.1: 3072) a rank adapts nothing
    more, and a rank of 10**20 would only fail to allocate."""
    lora_alpha: float = Field(default=16.0, gt=0)
    """LoRA alpha; the adapter output is scaled by alpha / rank."""
    base_precision: BasePrecision = "bf16"
    """Mode 'lora': how the frozen base's linear weights are stored. 'bf16': in param_dtype (what FSDP2
    gathers them in anyway: the same numbers as a float32 copy, half the memory); 'fp8': float8 e4m3 with
    one scale per output channel (about half of bf16); 'nf4': 4-bit NormalFloat in 64-weight blocks with
    a float32 absmax each (bitsandbytes' NF4 bytes, 0.5625 bytes a weight). Each is dequantized to bf16
    for its matmul; the adapters and their optimizer are unchanged (training/quantized_base.py). A
    pre-quantized train.pretrained_path (flux-cluster models quantize) needs its own precision here."""
    lora_targets: list[ModuleName] = ["to_q", "to_k", "to_v", "to_out.0"]
    """Module names that get adapters (peft target_modules). The hf workload, when this is left unset,
    takes peft's default targets of the model's architecture (BERT: query, value; GPT-2: c_attn; ViT:
    query, value); set ones are checked against the model's module names."""
    tensorboard: bool = True
    """Write TensorBoard scalars to <run dir>/tensorboard/."""
    synthetic_data: SyntheticDataConfig | None = None
    """Generate this synthetic dataset when paths.data_root is unset (into the user cache) or empty."""

    @property
    def caption_dropout_rate(self) -> float:
        """caption_dropout, or cfg_dropout (its older name) when unset."""
        rate = self.caption_dropout if self.caption_dropout is not None else self.cfg_dropout
        return DEFAULT_CAPTION_DROPOUT if rate is None else rate

    @field_validator("micro_batch_size", mode="wrap")
    @classmethod
    def _micro_batch(cls, value: object, handler: ValidatorFunctionWrapHandler) -> object:
        # pydantic's int conversion ("8", 8.0 -> 8) but no bools, and one line for anything else (a
        # union's errors would name its members)
        if not isinstance(value, bool):
            with contextlib.suppress(ValidationError):
                return handler(value)
        raise ValueError(f"got {value!r}, expected an integer >= 1 or 'auto'")

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _checkpointing_flag(cls, value: object) -> object:
        return {True: "full", False: "none"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _consistent(self) -> "TrainConfig":
        # the hf workload's pretrained model is hf.model
        if self.mode != "pretrain" and not self.pretrained_path and self.benchmark != "hf":
            raise ValueError(f"mode {self.mode!r} needs train.pretrained_path (a local diffusers checkpoint)")
        if self.base_precision != "bf16" and (self.mode != "lora" or self.benchmark == "hf"):
            raise ValueError(
                f"base_precision {self.base_precision!r} needs mode 'lora' of a FLUX workload "
                f"(got mode {self.mode!r}, benchmark {self.benchmark!r})"
            )
        both = self.caption_dropout is not None and self.cfg_dropout is not None
        if both and self.caption_dropout != self.cfg_dropout:
            raise ValueError(
                f"caption_dropout {self.caption_dropout} and cfg_dropout {self.cfg_dropout} are one "
                f"setting (cfg_dropout is its older name): set one"
            )
        if self.lora_init and self.mode != "lora":
            raise ValueError(f"lora_init needs mode 'lora' (got mode {self.mode!r})")
        if self.precision == "fp8" and (self.param_dtype != "bfloat16" or self.mode == "lora"):
            raise ValueError(
                f"precision 'fp8' needs param_dtype 'bfloat16' and mode 'pretrain' or 'finetune' "
                f"(got param_dtype {self.param_dtype!r}, mode {self.mode!r})"
            )
        mbs = self.micro_batch_size
        if self.global_batch_size is not None and mbs != "auto" and self.global_batch_size % mbs:
            raise ValueError(
                f"global_batch_size {self.global_batch_size} is not a multiple of "
                f"micro_batch_size {self.micro_batch_size}"
            )
        return self
