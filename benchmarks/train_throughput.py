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
  per mode (full, alternate, single, ops, ops+N, none), compile per block, ``attention_backend("auto")``
  around forward and backward, the rectified-flow loss, AdamW (fused on CUDA, foreach on CPU), clipping
  at 1.0.
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
of samples/s: ours and ours-fp8 over the peer, ours-fp8 over ours, wherever both ran, and ours' other
modes over the peer's full checkpointing, each with its ratio of peak memory. A case that runs
out of memory, or fails otherwise, gets a one-line note and the run goes on; rows print as they finish
and --json/--markdown are rewritten after each case. ours-fp8 runs once per --fp8-recipes (torchao
tensorwise, rowwise); --gc frozen freezes what exists after warm-up out of garbage collection;
--cases picks impl:mode pairs; --profile writes one profiled step's top operators per case (GPU);
--reduce-dtype float32 makes ours' one-rank gradient copy float32, as before parallelize.reduce_dtype.
"""

import argparse
import sys
import warnings
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from rich.console import Console
from throughput.cases import IMPLS, MODES, Row, Shape, cases, model_args
from throughput.output import (
    BRIEF,
    COLUMNS,
    RATIO_COLUMNS,
    goal_tables,
    print_memory_estimate,
    rich_table,
    tables,
    write_outputs,
)
from throughput.step import measure

from flux_cluster.config.training import is_checkpoint_mode
from flux_cluster.training.flops import training_flops_per_sample
from flux_cluster.training.memory import estimate_memory
from flux_cluster.training.parallelize import FP8_RECIPES
from flux_cluster.training.peak import measure_gemm_peak


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
        help="of ours (the job's code path), ours-fp8 (train.precision fp8), peer, lora-bf16|fp8|nf4 "
        "(LoRA on a frozen base of that precision: images/s and peak memory; their MFU counts full training)",
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
    parser.add_argument(
        "--reduce-dtype",
        choices=("auto", "float32"),
        default="auto",
        help="ours' gradient copy for FSDP's reduce: auto (parallelize.reduce_dtype: the compute dtype on "
        "one rank) or float32 (as before it: to measure the memory it saves)",
    )
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
    args.checkpointing = args.checkpointing.split(",")
    if unknown := [mode for mode in args.checkpointing if not is_checkpoint_mode(mode)]:
        parser.error(f"--checkpointing: unknown {', '.join(unknown)}; known: {', '.join(MODES)}")
    if args.cases:
        args.cases = [tuple(pair.split(":")) for pair in args.cases.split(",")]
        for pair in args.cases:
            mbs_ok = len(pair) == 2 or (len(pair) == 3 and pair[2].isdigit())
            if not mbs_ok or pair[0] not in IMPLS or not is_checkpoint_mode(pair[1]):
                what = f"{'|'.join(IMPLS)}:{'|'.join(MODES)}[:micro-batch]"
                parser.error(f"--cases: {':'.join(pair)} is not impl:mode[:mbs] ({what})")
    args.world_sizes = [int(w) for w in args.world_sizes.split(",")]
    return args


def main() -> None:
    args = parse_args()
    # Piped output (a file, a test) gets a wide table rather than rich's 80 columns.
    console = Console() if sys.stdout.isatty() else Console(width=400)
    if args.memory_estimate:
        print_memory_estimate(args, console)
        return
    # The peer's autocast feeds bf16 to float32 RMSNorm weights: torch says, once, it cannot fuse that.
    warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
    if args.reduce_dtype == "float32":
        from flux_cluster.training import parallelize

        parallelize.reduce_dtype = lambda *_: torch.float32  # parallelize() looks it up at each call
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
    if args.reduce_dtype == "float32":
        header += "; ours' one-rank gradient copy in float32 (--reduce-dtype float32, as before)"
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
        "reduce_dtype": args.reduce_dtype,
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
        if case.impl in ("ours", "ours-fp8"):  # the estimate is of full training
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
    for title, goal_headers, goal_rows in goal_tables(rows):
        console.print(rich_table(title, goal_headers, goal_rows))


if __name__ == "__main__":
    main()
