"""What benchmarks/train_throughput.py measures: the model's shape, the cases (implementation x
micro-batch x checkpointing x compile x fp8 recipe x gc mode) and a measured row."""

from dataclasses import dataclass, field

from flux_cluster.config.training import CHECKPOINT_MODES
from flux_cluster.config.workload import ModelArgs, load_workload

MODES = (*CHECKPOINT_MODES, "ops+N")
"""The checkpointing modes a case takes: the job's (train.activation_checkpointing) less 'auto'."""


PEER_MODES = ("full", "none")

IMPLS = ("ours", "ours-fp8", "peer", "lora-bf16", "lora-fp8", "lora-nf4", "torchtitan", "torchtitan-fp8")
"""lora-*: ours fine-tuning LoRA adapters over a frozen base stored in bf16, fp8 or nf4 (the ladder);
torchtitan(-fp8): torchtitan's own FLUX, built and wrapped by its own code (titan.py)."""

FP8_IMPLS = ("ours-fp8", "torchtitan-fp8")
"""Implementations that run once per --fp8-recipes."""

OWN_MODES = {"peer": PEER_MODES, "torchtitan": PEER_MODES, "torchtitan-fp8": PEER_MODES}
"""Implementations with their own checkpointing: whole blocks (full) or none; other modes are skipped."""

PHASES = ("data", "forward", "backward", "clip", "optimizer")

NAN = float("nan")


@dataclass(frozen=True)
class Shape:
    """What one run trains: the model and the token counts of a sample."""

    args: ModelArgs
    latent: int
    text_tokens: int

    @property
    def image_tokens(self) -> int:
        return (self.latent // 2) ** 2


@dataclass(frozen=True)
class Case:
    impl: str  # one of IMPLS
    micro_batch: int
    checkpointing: str
    compile: bool
    fp8_recipe: str = ""  # ours-fp8's torchao recipe (FP8_RECIPES)
    gc: str = "on"  # or "frozen" (run_case)

    @property
    def label(self) -> str:
        return _label(self.impl, self.fp8_recipe, self.gc)


def _label(impl: str, fp8_recipe: str, gc_mode: str) -> str:
    return impl + (f"/{fp8_recipe}" if fp8_recipe else "") + (" gc-frozen" if gc_mode == "frozen" else "")


@dataclass
class Row:
    impl: str
    micro_batch: int
    checkpointing: str
    compile: bool
    fp8_recipe: str = ""
    gc: str = "on"
    status: str = "ok"  # or "out of memory", or a one-line reason
    step_ms: float = NAN
    samples_per_s: float = NAN
    tflops: float = NAN
    mfu_datasheet: float = NAN
    mfu_measured: float = NAN
    peak_gb: float = NAN
    estimate_gb: float = NAN
    data_ms: float = NAN
    forward_ms: float = NAN
    backward_ms: float = NAN
    clip_ms: float = NAN
    optimizer_ms: float = NAN
    host_gap_pct: float = NAN
    """How much longer the timed step is than the sum of its phases, in % of the step: the host's share
    when the device waits for it (launch-bound)."""
    ops_per_step: float = NAN
    """Operators the host dispatches in one step (dispatch_count.py)."""
    kernels_per_step: float = NAN
    """GPU kernels (and copies) one step runs, from the profiler; nan on CPU."""
    host_median_ms: float = NAN
    """The host's time to issue one timed step (median): near step_ms, the host is the limit."""
    host_max_ms: float = NAN
    gc_ms: float = NAN
    """Garbage collection per timed step, and the full collections among the timed steps."""
    full_gcs: float = NAN
    recompiles: float = NAN
    """Graphs torch.compile made during the timed steps (should be 0)."""
    time_groups: dict[str, float] = field(default_factory=dict)
    """ms of one profiled step by group (profile_groups.GROUPS): GPU kernels' device time, or the CPU
    operators' own time; profiled on GPUs, and on the CPU with --profile."""

    @property
    def label(self) -> str:
        return _label(self.impl, self.fp8_recipe, self.gc)


def model_args(preset: str, double: int, single: int) -> ModelArgs:
    args = load_workload("flux1")[0].models[preset]
    return args.model_copy(update={"num_layers": double, "num_single_layers": single})


def cases(
    batches: list[int],
    modes: list[str],
    compiles: list[bool],
    impls: list[str],
    fp8_recipes: list[str] | tuple[str, ...] = ("tensorwise",),
    gc_modes: list[str] | tuple[str, ...] = ("on",),
    pairs: list[tuple[str, ...]] | None = None,
) -> list[Case]:
    """Ours next to the peer for each setting, so the two see the machine in the same state; ours-fp8
    once per recipe; each once per garbage-collection mode. ``pairs`` (impl, mode[, micro-batch]), in
    their order, replace impls x modes (and the batches where they name one)."""
    grid = [(impl, mode, b) for b in batches for mode in modes for impl in impls]
    if pairs:
        grid = [(impl, mode, b) for impl, mode, *own in pairs for b in ([int(own[0])] if own else batches)]
    out = []
    for impl, mode, micro_batch in grid:
        for compiled in compiles:
            for gc_mode in gc_modes:
                if mode not in OWN_MODES.get(impl, (mode,)):
                    continue
                if impl in FP8_IMPLS:
                    out += [Case(impl, micro_batch, mode, compiled, r, gc_mode) for r in fp8_recipes]
                else:
                    out.append(Case(impl, micro_batch, mode, compiled, "", gc_mode))
    return out
