"""One case of benchmarks/train_throughput.py: build "ours" or the "peer", train steps, time them."""

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from flux_cluster.config.workload import ModelArgs
from flux_cluster.training.attention import attention_backend
from flux_cluster.training.dispatch_count import count_dispatched
from flux_cluster.training.mlperf_log import ADAMW, GRADIENT_CLIP_NORM
from flux_cluster.training.model import build_model, init_weights, is_on_meta, predict_velocity
from flux_cluster.training.parallelize import make_mesh, parallelize
from flux_cluster.training.rectified_flow import interpolate, sample_latents
from throughput.cases import NAN, PHASES, Case, Row, Shape


@dataclass
class Trainer:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    input_dtype: torch.dtype  # what predict_velocity casts the inputs to
    autocast: bool
    attention: str = "auto"  # train.attention_backend; 'flash' on the CPU too counts what GPUs keep
    predict: Callable[..., torch.Tensor] = predict_velocity
    """The model call (x_t, t, T5, CLIP, dtype -> velocity [B, C, H, W]): the diffusers model's, or
    torchtitan's (titan.py)."""


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


def adamw(
    params: list[torch.nn.Parameter], device: torch.device, fused: bool = False
) -> torch.optim.Optimizer:
    kind = {"fused": True} if fused or device.type == "cuda" else {"foreach": True}
    betas = (ADAMW["beta_1"], ADAMW["beta_2"])
    return torch.optim.AdamW(
        params, lr=1e-4, betas=betas, eps=ADAMW["epsilon"], weight_decay=ADAMW["weight_decay"], **kind
    )


def build_ours(
    case: Case, args: ModelArgs, device: torch.device, mesh: DeviceMesh | None = None, as_on_gpu: bool = False
) -> Trainer:
    """``mesh``: a 1-rank mesh made beforehand (memory_accounting.py builds under a fake tensor mode,
    which cannot make one); ``as_on_gpu``: on the CPU too, the model built on the meta device and AdamW
    fused, as on a GPU (memory_accounting.py)."""
    torch.manual_seed(0)
    model = build_model(args, meta_init=as_on_gpu or device.type == "cuda")
    if case.impl.startswith("lora-"):
        lora_on_quantized_base(model, case.impl.removeprefix("lora-"), device)
    parallelize(
        model,
        mesh or make_mesh(device, 1, 1),
        device,
        param_dtype=torch.bfloat16,
        activation_checkpointing=case.checkpointing,
        compile_blocks=case.compile,
        precision="fp8" if case.impl == "ours-fp8" else "bf16",
        fp8_recipe=case.fp8_recipe or "tensorwise",
    )
    params = [p for p in model.parameters() if p.requires_grad]
    return Trainer(model, adamw(params, device, as_on_gpu), params, torch.bfloat16, autocast=False)


def lora_on_quantized_base(model: torch.nn.Module, precision: str, device: torch.device) -> None:
    """As the job's LoRA fine-tuning: random weights (the proxy has no checkpoint), adapters on the job's
    default targets, the frozen base stored at precision (bf16, fp8 or nf4). Built on the device, then the
    peak memory starts again: the float32 weights before quantizing are not what training holds."""
    from flux_cluster.config.training import TrainConfig
    from flux_cluster.training.model import add_lora
    from flux_cluster.training.quantized_base import quantize_base

    if is_on_meta(model):  # built on the meta device (GPUs): quantizing needs real weights
        model.to_empty(device=device)
        init_weights(model)
    defaults = TrainConfig.model_fields
    targets = list(defaults["lora_targets"].default)
    add_lora(model, defaults["lora_rank"].default, defaults["lora_alpha"].default, targets)
    quantize_base(model, precision, torch.bfloat16)
    if device.type == "cuda":  # GPU only
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def build_peer(
    case: Case, args: ModelArgs, device: torch.device, mesh: DeviceMesh | None = None, as_on_gpu: bool = False
) -> Trainer:
    """As build_ours (``mesh`` unused: the peer has no FSDP; ``as_on_gpu``: AdamW fused)."""
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
    return Trainer(model, adamw(params, device, as_on_gpu), params, torch.float32, autocast=True)


def builder(impl: str) -> Callable[..., Trainer]:
    """The build function of an implementation (cases.IMPLS)."""
    if impl.startswith("torchtitan"):
        from throughput.titan import build_titan  # torchtitan is a benchmark-only dependency

        return build_titan
    return build_peer if impl == "peer" else build_ours


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
    with attention_backend(trainer.attention, device):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=trainer.autocast):
            prediction = trainer.predict(trainer.model, x_t, t, t5, clip, trainer.input_dtype)
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
) -> dict[str, Any]:
    """Seconds per step (back to back, synced once) and the median ms of each phase over as many steps.
    ``gc_mode`` 'frozen': what exists after the warm-up is frozen out of collections (gc.freeze), and
    only the youngest generation is collected during the steps, as the training job does."""
    trainer = builder(case.impl)(case, shape.args, device)
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
    if device.type == "cuda" or profile_dir:
        kernels, timings["time_groups"] = profile_step(trainer, batch, device, case, profile_dir)
        if device.type == "cuda":
            timings["kernels_per_step"] = kernels
    try:  # last: a torch whose compile refuses to run under a dispatch mode fails this step only
        timings["ops_per_step"] = count_dispatched(train_step, trainer, batch, device, lambda _: None).total
    except Exception as exc:
        print(f"ops/step not counted: {type(exc).__name__}: {str(exc).strip()[:120]}", flush=True)
    return timings


def profile_step(
    trainer: Trainer, batch: list[torch.Tensor], device: torch.device, case: Case, profile_dir: Path | None
) -> tuple[int, dict[str, float]]:
    """GPU kernels and copies one profiled step runs (0 on the CPU), and its time by group
    (profile_groups.py: fp8 and bf16 GEMMs, attention, amax, casts, optimizer, other; GPU: kernels' device
    time, CPU: operators' own time). With ``profile_dir``, that step's operators by host and device time,
    the groups and the top kernels go there as text, one file per case."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from throughput.profile_groups import groups_text, time_groups

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CUDA] * cuda + [ProfilerActivity.CPU] * (bool(profile_dir) or not cuda)
    with profile(activities=activities) as prof:
        train_step(trainer, batch, device, lambda _: None)
        synchronize(device)
    events = prof.events()
    groups, ranked = time_groups(events, cuda)
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
        mode = case.checkpointing.replace("+", "-")  # names the device tool brings back: no '+'
        name = f"{case.label.replace('/', '-').replace(' ', '-')}_mbs{case.micro_batch}_{mode}.txt"
        averages = prof.key_averages()
        keys = ("self_cpu_time_total", "cuda_time_total") if cuda else ("self_cpu_time_total",)
        tables = [averages.table(sort_by=key, row_limit=30) for key in keys]
        (profile_dir / name).write_text(groups_text(groups, ranked, cuda) + "\n" + "\n\n".join(tables) + "\n")
    return sum(1 for event in events if event.device_type == DeviceType.CUDA), groups


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
