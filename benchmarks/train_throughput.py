"""Training throughput of the FLUX transformer on one accelerator: samples/s, step time, TFLOP/s and MFU.

    python benchmarks/train_throughput.py                     # GPU: flux-schnell width, reduced depth
    python benchmarks/train_throughput.py --smoke             # CPU: the tiny preset, to check the script

The model is the flux-schnell width (hidden 3072, 24 heads, 256 image + 256 text tokens) with fewer
blocks (--double/--single) so it fits one GPU. Each case runs the training job's own code path: FSDP2
``parallelize`` on a 1-rank mesh (bf16 compute, fp32 master weights and reduction), the rectified-flow
loss, AdamW and grad clipping, over micro-batches (--batches), with and without torch.compile per block
and activation checkpointing. FLOPs per sample come from the shape formula (flux_cluster/training/
flops.py); MFU divides by the peak given (--peak-tflops, default: H100/H200 SXM dense bf16, 989).
Every case is also reported as a ratio to the first case (eager, no checkpointing, smallest batch).
"""

import argparse
import itertools
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from flux_cluster.training.flops import training_flops_per_sample
from flux_cluster.training.model import build_model, predict_velocity
from flux_cluster.training.parallelize import make_mesh, parallelize
from flux_cluster.training.rectified_flow import interpolate, sample_latents
from flux_cluster.training.workload import ModelArgs, load_workload


@dataclass(frozen=True)
class Case:
    micro_batch: int
    compile: bool
    checkpointing: bool


def model_args(preset: str, double: int, single: int) -> ModelArgs:
    args = load_workload("flux1")[0].models[preset]
    return args.model_copy(update={"num_layers": double, "num_single_layers": single})


def run_case(
    case: Case, args: ModelArgs, device: torch.device, latent: int, steps: int, warmup: int
) -> float:
    """Seconds per optimizer step (median of the timed steps)."""
    torch.manual_seed(0)
    model = build_model(args, meta_init=device.type == "cuda")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    parallelize(
        model,
        make_mesh(device, 1, 1),
        device,
        param_dtype=dtype,
        activation_checkpointing=case.checkpointing,
        compile_blocks=case.compile,
    )
    kind = {"fused": True} if device.type == "cuda" else {"foreach": True}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, **kind)
    b, text = case.micro_batch, 256 if args.joint_attention_dim == 4096 else 16
    mean = torch.randn(b, 16, latent, latent, device=device)
    logvar = torch.full_like(mean, -4.0)
    t5 = torch.randn(b, text, args.joint_attention_dim, device=device, dtype=torch.bfloat16)
    clip = torch.randn(b, args.pooled_projection_dim, device=device, dtype=torch.bfloat16)
    times = []
    for step in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        eps, noise, t = torch.randn_like(mean), torch.randn_like(mean), torch.rand(b, device=device)
        x_t, target = interpolate(sample_latents(mean, logvar, eps), noise, t)
        loss = F.mse_loss(predict_velocity(model, x_t, t, t5, clip, dtype).float(), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    del model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--double", type=int, default=4, help="double-stream blocks (flux-schnell: 19)")
    parser.add_argument("--single", type=int, default=8, help="single-stream blocks (flux-schnell: 38)")
    parser.add_argument("--batches", default="1,2,4,8", help="micro-batch sizes to measure")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile cases")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny preset, 2 steps: checks the script")
    args = parser.parse_args()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    if args.smoke:
        shape, latent, batches, steps, warmup = model_args("tiny", 1, 1), 16, [1, 2], 2, 1
        compile_options = [False]
    else:
        shape, latent = model_args("flux-schnell", args.double, args.single), 32
        batches, steps, warmup = [int(b) for b in args.batches.split(",")], args.steps, args.warmup
        compile_options = [False] if args.no_compile else [False, True]
    flops = training_flops_per_sample(shape.shape(), (latent // 2) ** 2, 256 if not args.smoke else 16)
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(f"device {name}; hidden {shape.hidden}, {shape.num_layers}+{shape.num_single_layers} blocks, "
          f"{flops / 1e12:.3f} TFLOP per training sample")  # fmt: skip
    print(f"{'mbs':>4} {'compile':>8} {'act-ckpt':>9} {'step ms':>9} {'samples/s':>10} {'TFLOP/s':>9} "
          f"{'MFU':>7} {'peak GB':>8} {'vs first':>9}")  # fmt: skip
    baseline = None
    for batch, compiled, checkpointing in itertools.product(batches, compile_options, [False, True]):
        case = Case(batch, compiled, checkpointing)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            seconds = run_case(case, shape, device, latent, steps, warmup)
        except torch.OutOfMemoryError:
            print(f"{batch:>4} {compiled!s:>8} {checkpointing!s:>9}   out of memory")
            torch.cuda.empty_cache()
            continue
        rate = batch / seconds
        tflops = rate * flops / 1e12
        memory = torch.cuda.max_memory_allocated() / 1e9 if cuda else float("nan")
        baseline = baseline or rate
        row = (
            f"{batch:>4} {compiled!s:>8} {checkpointing!s:>9} {seconds * 1e3:9.1f} {rate:10.2f} {tflops:9.1f}"
        )
        print(f"{row} {tflops / args.peak_tflops:7.1%} {memory:8.1f} {rate / baseline:8.2f}x", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
