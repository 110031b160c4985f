"""Training throughput of the FLUX transformer on one GPU: the training job's own code path ("ours")
against the same model trained the plain way ("peer"), in one run.

    python benchmarks/train_throughput.py --json out.json --markdown out.md    # GPU: all cases
    python benchmarks/train_throughput.py --compile off      # a part (also --batches, --checkpointing)
    python benchmarks/train_throughput.py --smoke              # CPU: tiny preset, checks the script
    python benchmarks/train_throughput.py --memory-estimate    # full-depth flux-schnell per GPU, no GPU

The model has the flux-schnell width (hidden 3072, 24 heads, T5 4096 / CLIP 768, 256 image tokens from a
32x32 latent and 256 text tokens) and fewer blocks (--double/--single, default 4+8) so that it fits one
GPU. Each case is a micro-batch size x activation checkpointing mode x torch.compile on/off:

- ours: what flux_cluster/training/loop.py runs: ``parallelize`` on a 1-rank mesh (FSDP2, bf16 parameters
  from a MixedPrecisionPolicy over float32 master weights, gradients reduced in float32), checkpointing
  per mode (full, alternate, single, ops, none), compile per block, ``attention_backend("auto")`` around
  forward and backward, the rectified-flow loss, AdamW (fused on CUDA, foreach on CPU), clipping at 1.0.
- peer: the same diffusers FluxTransformer2DModel trained the plain way: float32 weights on the device,
  torch.autocast(bf16), fused AdamW, no FSDP; diffusers' ``enable_gradient_checkpointing()`` (full only:
  the peer runs modes full and none), ``compile_repeated_blocks(fullgraph=True)``. It gets the same
  attention kernels (cuDNN's SDPA backward fails at these shapes on the measured stack: attention.py).

Per case: step time (steps back to back, one sync at the end), samples/s, TFLOP/s (FLOPs from the shape,
flops.py), MFU against --peak-tflops (the datasheet's dense bf16, 989 for H100/H200 SXM) and against the
bf16 GEMM peak measured at start (peak.py), peak memory (max_memory_allocated; nan on CPU), the memory
estimate for ours (memory.py: eager, so compiled runs should peak below it), and a split by phase from
extra steps timed with CUDA events: data (host-to-device copy of a pinned host batch: stands for the
loader), forward, backward, clip, optimizer. Host-bound guards: the host gap (how much longer the timed
step is than its phases' sum, in % of the step), the operators the host dispatches in one step
(dispatch_count.py; CPU-measurable), GPU kernels per step (profiler), the host's time to issue a step
(median and max), garbage collection in the timed steps, and graphs compiled during them. Then ratios
of samples/s: ours and ours-fp8 over the peer, ours-fp8 over ours, wherever both ran. A case that runs
out of memory, or fails otherwise, gets a one-line note and the run goes on; rows print as they finish
and --json/--markdown are rewritten after each case. ours-fp8 runs once per --fp8-recipes (torchao
tensorwise, rowwise); --gc frozen freezes what exists after warm-up out of garbage collection;
--cases picks impl:mode pairs; --profile writes one profiled step's top operators per case (GPU).
"""

import argparse
import gc
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from flux_cluster.training.attention import attention_backend
from flux_cluster.training.dispatch_count import count_dispatched
from flux_cluster.training.flops import training_flops_per_sample
from flux_cluster.training.memory import AUTO_HEADROOM, choose_checkpointing, estimate_memory
from flux_cluster.training.mlperf_log import ADAMW, GRADIENT_CLIP_NORM
from flux_cluster.training.model import build_model, init_weights, predict_velocity
from flux_cluster.training.parallelize import FP8_RECIPES, make_mesh, parallelize
from flux_cluster.training.peak import measure_gemm_peak
from flux_cluster.training.rectified_flow import interpolate, sample_latents
from flux_cluster.training.workload import ModelArgs, load_workload

MODES = ("full", "alternate", "single", "ops", "none")
PEER_MODES = ("full", "none")
IMPLS = ("ours", "ours-fp8", "peer")
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
    impl: str  # "ours", "ours-fp8" or "peer"
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

    @property
    def label(self) -> str:
        return _label(self.impl, self.fp8_recipe, self.gc)


@dataclass
class Trainer:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    input_dtype: torch.dtype  # what predict_velocity casts the inputs to
    autocast: bool


@dataclass
class PhaseClock:
    """Marks between phases of one step: CUDA events (read after the step) or perf_counter on the CPU."""

    device: torch.device
    marks: list[tuple[str, object]] = field(default_factory=list)

    def __call__(self, name: str) -> None:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((name, event))
        else:
            self.marks.append((name, time.perf_counter()))

    def phases_ms(self) -> dict[str, float]:
        synchronize(self.device)
        out = {}
        for (_, start), (name, end) in zip(self.marks, self.marks[1:], strict=False):
            cuda = self.device.type == "cuda"
            out[name] = start.elapsed_time(end) if cuda else (end - start) * 1e3  # type: ignore[attr-defined]
        return out


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_args(preset: str, double: int, single: int) -> ModelArgs:
    args = load_workload("flux1")[0].models[preset]
    return args.model_copy(update={"num_layers": double, "num_single_layers": single})


def adamw(params: list[torch.nn.Parameter], device: torch.device) -> torch.optim.Optimizer:
    kind = {"fused": True} if device.type == "cuda" else {"foreach": True}
    betas = (ADAMW["beta_1"], ADAMW["beta_2"])
    return torch.optim.AdamW(
        params, lr=1e-4, betas=betas, eps=ADAMW["epsilon"], weight_decay=ADAMW["weight_decay"], **kind
    )


def build_ours(case: Case, args: ModelArgs, device: torch.device) -> Trainer:
    torch.manual_seed(0)
    model = build_model(args, meta_init=device.type == "cuda")
    parallelize(
        model,
        make_mesh(device, 1, 1),
        device,
        param_dtype=torch.bfloat16,
        activation_checkpointing=case.checkpointing,
        compile_blocks=case.compile,
        precision="fp8" if case.impl == "ours-fp8" else "bf16",
        fp8_recipe=case.fp8_recipe or "tensorwise",
    )
    params = list(model.parameters())
    return Trainer(model, adamw(params, device), params, torch.bfloat16, autocast=False)


def build_peer(case: Case, args: ModelArgs, device: torch.device) -> Trainer:
    torch.manual_seed(0)
    model = build_model(args, meta_init=device.type == "cuda")
    if device.type == "cuda":
        model.to_empty(device=device)
        init_weights(model)
    if case.checkpointing == "full":
        model.enable_gradient_checkpointing()
    if case.compile:
        if hasattr(model, "compile_repeated_blocks"):
            model.compile_repeated_blocks(fullgraph=True)
        else:
            for block in [*model.transformer_blocks, *model.single_transformer_blocks]:
                block.compile(fullgraph=True)
    params = list(model.parameters())
    return Trainer(model, adamw(params, device), params, torch.float32, autocast=True)


def host_batch(shape: Shape, micro_batch: int, cuda: bool) -> list[torch.Tensor]:
    """A synthetic loader batch on the host (pinned for CUDA): latent mean and logvar, T5, CLIP."""
    b, args = micro_batch, shape.args
    batch = [
        torch.randn(b, 16, shape.latent, shape.latent),
        torch.full((b, 16, shape.latent, shape.latent), -4.0),
        torch.randn(b, shape.text_tokens, args.joint_attention_dim, dtype=torch.bfloat16),
        torch.randn(b, args.pooled_projection_dim, dtype=torch.bfloat16),
    ]
    return [x.pin_memory() for x in batch] if cuda else batch


def train_step(
    trainer: Trainer, batch: list[torch.Tensor], device: torch.device, mark: Callable[[str], None]
) -> None:
    """One optimizer step of one micro-batch, as the job's _train_step does it; ``mark`` after each phase."""
    mean, logvar, t5, clip = (x.to(device, non_blocking=True) for x in batch)
    mark("data")
    eps, noise = torch.randn_like(mean), torch.randn_like(mean)
    t = torch.rand(mean.shape[0], device=device)
    x_t, target = interpolate(sample_latents(mean, logvar, eps), noise, t)
    with attention_backend("auto", device):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=trainer.autocast):
            prediction = predict_velocity(trainer.model, x_t, t, t5, clip, trainer.input_dtype)
        loss = F.mse_loss(prediction.float(), target)
        mark("forward")
        loss.backward()
        mark("backward")
    torch.nn.utils.clip_grad_norm_(trainer.params, GRADIENT_CLIP_NORM)
    mark("clip")
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    mark("optimizer")


class GcClock:
    """Time Python's garbage collector takes while active (a full collection with torch, diffusers and
    compiled graphs loaded takes a large fraction of a second: one in a timed window is a host gap)."""

    def __init__(self) -> None:
        self.seconds, self.full_collections, self._start = 0.0, 0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.full_collections += info.get("generation") == 2

    def __enter__(self) -> "GcClock":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def run_case(
    case: Case,
    shape: Shape,
    device: torch.device,
    steps: int,
    warmup: int,
    gc_mode: str = "on",
    profile_dir: Path | None = None,
) -> dict[str, float]:
    """Seconds per step (back to back, synced once) and the median ms of each phase over as many steps.
    ``gc_mode`` 'frozen': what exists after the warm-up is frozen out of collections (gc.freeze), and
    only the youngest generation is collected during the steps, as the training job does."""
    build = build_peer if case.impl == "peer" else build_ours
    trainer = build(case, shape.args, device)
    batch = host_batch(shape, case.micro_batch, device.type == "cuda")
    for _ in range(warmup):
        train_step(trainer, batch, device, lambda _: None)
    synchronize(device)
    if gc_mode == "frozen":
        gc.collect()
        gc.freeze()
    compiled_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    host = []
    with GcClock() as gc_clock:
        start = time.perf_counter()
        for _ in range(steps):
            began = time.perf_counter()
            train_step(trainer, batch, device, lambda _: None)
            host.append(time.perf_counter() - began)
        synchronize(device)
        timings = {"step_s": (time.perf_counter() - start) / steps}
    timings["gc_ms"] = gc_clock.seconds * 1e3 / steps
    timings["full_gcs"] = gc_clock.full_collections
    timings["host_median_ms"] = statistics.median(host) * 1e3
    timings["host_max_ms"] = max(host) * 1e3
    timings["recompiles"] = torch._dynamo.utils.counters["stats"]["unique_graphs"] - compiled_before
    per_step = []
    for _ in range(steps):
        clock = PhaseClock(device)
        clock("start")
        train_step(trainer, batch, device, clock)
        per_step.append(clock.phases_ms())
    timings |= {f"{p}_ms": statistics.median(s[p] for s in per_step) for p in PHASES}
    if device.type == "cuda":
        timings["kernels_per_step"] = count_kernels(trainer, batch, device, case, profile_dir)
    try:  # last: a torch whose compile refuses to run under a dispatch mode fails this step only
        timings["ops_per_step"] = count_dispatched(train_step, trainer, batch, device, lambda _: None).total
    except Exception as exc:
        print(f"ops/step not counted: {type(exc).__name__}: {str(exc).strip()[:120]}", flush=True)
    return timings


def count_kernels(
    trainer: Trainer, batch: list[torch.Tensor], device: torch.device, case: Case, profile_dir: Path | None
) -> int:
    """GPU kernels and copies one step runs, from one profiled step; with ``profile_dir``, that step's
    operators by host time and by GPU time go there as text, one file per case."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if profile_dir else [])
    with profile(activities=activities) as prof:
        train_step(trainer, batch, device, lambda _: None)
        synchronize(device)
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
        name = f"{case.label.replace('/', '-')}_mbs{case.micro_batch}_{case.checkpointing}.txt"
        averages = prof.key_averages()
        tables = [
            averages.table(sort_by=key, row_limit=30) for key in ("self_cpu_time_total", "cuda_time_total")
        ]
        (profile_dir / name).write_text("\n\n".join(tables) + "\n")
    return sum(1 for event in prof.events() if event.device_type == DeviceType.CUDA)


def measure(
    case: Case, shape: Shape, device: torch.device, steps: int, warmup: int, profile_dir: Path | None = None
) -> Row:
    """One case, out of memory and other failures included (as the row's status)."""
    cuda = device.type == "cuda"
    row = Row(case.impl, case.micro_batch, case.checkpointing, case.compile, case.fp8_recipe, case.gc)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    torch._dynamo.reset()  # each case compiles its own blocks afresh: no recompile limits to hit
    try:
        timings = run_case(case, shape, device, steps, warmup, case.gc, profile_dir)
    except torch.OutOfMemoryError:
        row.status = "out of memory"
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        row.status = f"{type(exc).__name__}: {lines[0] if lines else ''}"[:160]
    else:
        row.step_ms = timings.pop("step_s") * 1e3
        for name, value in timings.items():
            setattr(row, name, value)
        row.samples_per_s = case.micro_batch / row.step_ms * 1e3
        phases = sum(getattr(row, f"{p}_ms") for p in PHASES)
        row.host_gap_pct = (row.step_ms - phases) / row.step_ms * 100
        row.peak_gb = torch.cuda.max_memory_allocated(device) / 1e9 if cuda else NAN
    gc.unfreeze()
    torch._dynamo.reset()
    gc.collect()  # the trainer is garbage only now (the exception no longer holds its frames)
    if cuda:
        torch.cuda.empty_cache()
    return row


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
                if impl == "ours-fp8":
                    out += [Case(impl, micro_batch, mode, compiled, r, gc_mode) for r in fp8_recipes]
                elif impl != "peer" or mode in PEER_MODES:
                    out.append(Case(impl, micro_batch, mode, compiled, "", gc_mode))
    return out


def ratios(rows: list[Row]) -> list[dict[str, object]]:
    """ours/peer and ours-fp8/peer samples/s for each (micro-batch, checkpointing, compile) both ran, and
    ours-fp8 over ours (bf16) where both ran."""
    ok = {(r.label, r.micro_batch, r.checkpointing, r.compile): r for r in rows if r.status == "ok"}
    out = []
    for (label, mbs, mode, compiled), ours in ok.items():
        if label == "peer":
            continue
        for base in ("peer", "ours"):
            other = ok.get((base, mbs, mode, compiled))
            if other is None or base == label:
                continue
            out.append(
                {
                    "impl": label,
                    "over": base,
                    "micro_batch": mbs,
                    "checkpointing": mode,
                    "compile": compiled,
                    "samples_per_s": ours.samples_per_s,
                    "other_samples_per_s": other.samples_per_s,
                    "ratio": ours.samples_per_s / other.samples_per_s,
                }
            )
    return out


# ---- output: a rich table on the console, a markdown table, JSON


def _num(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


COLUMNS = (
    ("impl", lambda r: r.label),
    ("mbs", lambda r: str(r.micro_batch)),
    ("act-ckpt", lambda r: r.checkpointing),
    ("compile", lambda r: "on" if r.compile else "off"),
    ("step ms", lambda r: _num(r.step_ms, ".1f")),
    ("samples/s", lambda r: _num(r.samples_per_s, ".2f")),
    ("TFLOP/s", lambda r: _num(r.tflops, ".1f")),
    ("MFU", lambda r: _num(r.mfu_datasheet, ".1%")),
    ("MFU meas.", lambda r: _num(r.mfu_measured, ".1%")),
    ("peak GB", lambda r: _num(r.peak_gb, ".1f")),
    ("est. GB", lambda r: _num(r.estimate_gb, ".1f")),
    *((f"{p} ms", lambda r, p=p: _num(getattr(r, f"{p}_ms"), ".1f")) for p in PHASES),
    ("host gap", lambda r: _num(r.host_gap_pct, ".1f") + ("%" if not math.isnan(r.host_gap_pct) else "")),
    ("ops/step", lambda r: _num(r.ops_per_step, ".0f")),
    ("kernels/step", lambda r: _num(r.kernels_per_step, ".0f")),
    ("host ms (max)", lambda r: f"{_num(r.host_median_ms, '.1f')} ({_num(r.host_max_ms, '.0f')})"),
    ("gc ms (full)", lambda r: f"{_num(r.gc_ms, '.1f')} ({_num(r.full_gcs, '.0f')})"),
    ("recompiles", lambda r: _num(r.recompiles, ".0f")),
    ("note", lambda r: "" if r.status == "ok" else r.status),
)
RATIO_COLUMNS = ("impl", "over", "mbs", "act-ckpt", "compile", "samples/s", "its samples/s", "ratio")


def ratio_cells(ratio: dict) -> list[str]:
    return [
        ratio["impl"],
        ratio["over"],
        str(ratio["micro_batch"]),
        ratio["checkpointing"],
        "on" if ratio["compile"] else "off",
        f"{ratio['samples_per_s']:.2f}",
        f"{ratio['other_samples_per_s']:.2f}",
        f"{ratio['ratio']:.2f}x",
    ]


def rich_table(title: str, headers: list[str] | tuple[str, ...], rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for header in headers:
        table.add_column(header, justify="left" if header in ("impl", "note") else "right")
    for cells in rows:
        table.add_row(*cells)
    return table


def markdown_table(headers: list[str] | tuple[str, ...], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(cells) + " |" for cells in rows)])


def memory_table(
    args: ModelArgs, worlds: list[int], batches: list[int], modes: list[str], gpu_gb: float
) -> tuple[list[str], list[list[str]]]:
    headers = ["world", "mbs", "act-ckpt", "weights+optim GB", "gathered GB", "activations GB", "total GB"]
    rows = []
    for world in worlds:
        for micro_batch in batches:
            for mode in modes:
                e = estimate_memory(args, world, micro_batch, mode)
                parts = (e.weights_and_optimizer_gb, e.gathered_params_gb, e.activations_gb, e.total_gb)
                fits = "yes" if e.total_gb <= gpu_gb else "no"
                auto = choose_checkpointing(args, world, micro_batch, gpu_gb).mode == mode
                rows.append(
                    [str(world), str(micro_batch), mode, *(f"{p:.1f}" for p in parts), fits, auto * "<- auto"]
                )
    return [*headers, f"fits {gpu_gb:g} GB", "auto picks"], rows


def parse_args() -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--double", type=int, default=4, help="double-stream blocks (flux-schnell: 19)")
    parser.add_argument("--single", type=int, default=8, help="single-stream blocks (flux-schnell: 38)")
    parser.add_argument("--batches", default="8,16,32", help="micro-batch sizes")
    parser.add_argument("--checkpointing", default="full,ops,none", help=f"modes, of {','.join(MODES)}")
    parser.add_argument("--compile", default="off,on", help="torch.compile per block: off, on, or both")
    parser.add_argument(
        "--impls",
        default="ours,peer",
        help="of ours (the job's code path), ours-fp8 (train.precision fp8), peer",
    )
    parser.add_argument(
        "--fp8-recipes", default="tensorwise", help=f"ours-fp8's recipes, of {','.join(FP8_RECIPES)}"
    )
    parser.add_argument(
        "--gc", default="on", help="on (Python's default), frozen (gc.freeze after warm-up), or both"
    )
    parser.add_argument(
        "--cases",
        help="impl:mode[:micro-batch] in this order (e.g. ours:full,peer:full,ours-fp8:ops:64), instead "
        "of --impls x --checkpointing (x --batches)",
    )
    parser.add_argument("--profile", type=Path, help="GPU: one profiled step's top operators per case here")
    parser.add_argument("--steps", type=int, default=10, help="timed steps, and as many phase-timed ones")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="datasheet dense bf16 TFLOP/s")
    parser.add_argument("--json", type=Path, help="write all rows and ratios here")
    parser.add_argument("--markdown", type=Path, help="write the tables here, for docs/benchmarks.md")
    parser.add_argument(
        "--smoke", action="store_true", help="CPU, tiny preset, 2 steps (unless given): checks the script"
    )
    parser.add_argument(
        "--memory-estimate", action="store_true", help="print the full-depth flux-schnell estimate and exit"
    )
    parser.add_argument("--world-sizes", default="8,16,32,64", help="FSDP group sizes for --memory-estimate")
    parser.add_argument("--gpu-gb", type=float, default=80.0, help="GPU memory for --memory-estimate")
    args = parser.parse_args()
    if args.smoke:  # the tiny preset on the CPU, eager, a few steps; options given still count
        smoke = {
            "batches": "2",
            "checkpointing": "full,none",
            "compile": "off",
            "impls": "ours,ours-fp8,peer",
        }
        for name, value in (smoke | {"steps": 2, "warmup": 1}).items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    args.batches = [int(b) for b in args.batches.split(",")]
    options = (
        ("checkpointing", MODES),
        ("compile", ("off", "on")),
        ("impls", IMPLS),
        ("fp8_recipes", FP8_RECIPES),
        ("gc", ("on", "frozen")),
    )
    for option, known in options:
        values = getattr(args, option).split(",")
        if unknown := set(values) - set(known):
            flag = option.replace("_", "-")
            parser.error(f"--{flag}: unknown {', '.join(sorted(unknown))}; known: {', '.join(known)}")
        setattr(args, option, values)
    args.compile = [value == "on" for value in args.compile]
    if args.cases:
        args.cases = [tuple(pair.split(":")) for pair in args.cases.split(",")]
        for pair in args.cases:
            mbs_ok = len(pair) == 2 or (len(pair) == 3 and pair[2].isdigit())
            if not mbs_ok or pair[0] not in IMPLS or pair[1] not in MODES:
                what = f"{'|'.join(IMPLS)}:{'|'.join(MODES)}[:micro-batch]"
                parser.error(f"--cases: {':'.join(pair)} is not impl:mode[:mbs] ({what})")
    args.world_sizes = [int(w) for w in args.world_sizes.split(",")]
    return args


def print_memory_estimate(args: argparse.Namespace, console: Console) -> None:
    full_depth = load_workload("flux1")[0].models["flux-schnell"]
    headers, rows = memory_table(full_depth, args.world_sizes, args.batches, args.checkpointing, args.gpu_gb)
    title = (
        "Memory per GPU, estimated: flux-schnell (19+38 blocks), FSDP over 'world' ranks, bf16, compiled; "
        "total = peak (activations count where they exceed the gradients the backward brings); "
        f"'auto' takes the least recompute under {1 - AUTO_HEADROOM:.0%} of --gpu-gb"
    )
    console.print(rich_table(title, headers, rows))


def main() -> None:
    args = parse_args()
    # Piped output (a file, a test) gets a wide table rather than rich's 80 columns.
    console = Console() if sys.stdout.isatty() else Console(width=400)
    if args.memory_estimate:
        print_memory_estimate(args, console)
        return
    # The peer's autocast feeds bf16 to float32 RMSNorm weights: torch says, once, it cannot fuse that.
    warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if args.smoke:
        shape = Shape(model_args("tiny", 1, 1), latent=16, text_tokens=16)
        torch.set_num_threads(1)  # tiny matrices: threads only spin-wait, 3x slower on a busy 2-core VM
    else:
        shape = Shape(model_args("flux-schnell", args.double, args.single), latent=32, text_tokens=256)

    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    flops = training_flops_per_sample(shape.args.shape(), shape.image_tokens, shape.text_tokens)
    gemm = measure_gemm_peak(device)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    a = shape.args
    header = (
        f"device {name}, torch {torch.__version__}; hidden {a.hidden}, {a.num_layers}+{a.num_single_layers} "
        f"blocks, {shape.image_tokens}+{shape.text_tokens} tokens, {flops / 1e12:.4g} TFLOP per training "
        f"sample; MFU vs {args.peak_tflops:g} TFLOP/s (datasheet) and vs {gemm.tflops:.1f} (measured bf16 "
        f"GEMM {'x'.join(map(str, gemm.shape))})"
    )
    console.print(header)
    facts = {
        "device": name,
        "torch": torch.__version__,
        "model": a.model_dump(),
        "image_tokens": shape.image_tokens,
        "text_tokens": shape.text_tokens,
        "tflop_per_sample": flops / 1e12,
        "peak_tflops_datasheet": args.peak_tflops,
        "gemm_peak": asdict(gemm),
        "steps": args.steps,
        "warmup": args.warmup,
    }
    rows: list[Row] = []
    for case in cases(
        args.batches, args.checkpointing, args.compile, args.impls, args.fp8_recipes, args.gc, args.cases
    ):
        row = measure(case, shape, device, args.steps, args.warmup, args.profile)
        row.tflops = row.samples_per_s * flops / 1e12
        row.mfu_datasheet = row.tflops / args.peak_tflops
        row.mfu_measured = row.tflops / gemm.tflops
        if case.impl != "peer":
            tokens = {"image_tokens": shape.image_tokens, "text_tokens": shape.text_tokens}
            est = estimate_memory(a, 1, case.micro_batch, case.checkpointing, compiled=case.compile, **tokens)
            row.estimate_gb = est.total_gb
        brief = [c for c in COLUMNS if c[0] in BRIEF]
        console.print(" ".join(f"{h} {c(row)}" for h, c in brief) + f" {row.status}", highlight=False)
        rows.append(row)
        write_outputs(args, header, facts, rows)  # after each case: a timeout loses only the one in flight
    dist.destroy_process_group()

    headers, cells, ratio_rows = tables(rows)
    console.print(rich_table("Training throughput", headers, cells))
    console.print(rich_table("Ratios of samples/s", RATIO_COLUMNS, ratio_rows))


BRIEF = ("impl", "mbs", "act-ckpt", "compile", "step ms", "samples/s", "MFU", "peak GB", "host gap")
BRIEF += ("ops/step", "kernels/step", "host ms (max)", "gc ms (full)", "recompiles")
"""The columns of the line printed as each case finishes."""


def tables(rows: list[Row]) -> tuple[list[str], list[list[str]], list[list[str]]]:
    headers = [h for h, _ in COLUMNS]
    cells = [[cell(r) for _, cell in COLUMNS] for r in rows]
    return headers, cells, [ratio_cells(r) for r in ratios(rows)]


def write_outputs(args: argparse.Namespace, header: str, facts: dict, rows: list[Row]) -> None:
    headers, cells, ratio_rows = tables(rows)
    if args.markdown:
        tables_md = f"{markdown_table(headers, cells)}\n\n{markdown_table(RATIO_COLUMNS, ratio_rows)}"
        args.markdown.write_text(f"{header}\n\n{tables_md}\n")
    if args.json:
        rows_facts = {"rows": [asdict(r) | {"label": r.label} for r in rows], "ratios": ratios(rows)}
        args.json.write_text(json.dumps(_nan_to_null(facts | rows_facts), indent=1) + "\n")


def _nan_to_null(value: object) -> object:
    """Strict JSON: a value a case lacks (a failed case, memory on the CPU) is null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_null(v) for v in value]
    return value


if __name__ == "__main__":
    main()
