"""Where one training step's peak memory goes, by category, for ours and the peer at the real proxy shape,
counted on the CPU without allocating it (torch's FSDPMemTracker/MemTracker under a FakeTensorMode, one
fake rank): sharded parameters, unsharded (gathered) parameters, gradients, optimizer states,
activations, temporaries (the backward's activation gradients; on one rank FSDP2's copy of a block's
gradients for the reduce, which it makes without a collective, counts here too), inputs.

    python benchmarks/memory_accounting.py       # peer full; ours full (float32 copy too), ops; fp8 ops
    python benchmarks/memory_accounting.py --cases ours:full,peer:full --micro-batch 16
    python benchmarks/memory_accounting.py --smoke                  # tiny preset: checks the script

Each case builds as benchmarks/throughput/step.py builds it for a GPU (model on the meta device, fused
AdamW, flash attention), runs one step to create the optimizer states, then counts one more. The count is
eager: compiled blocks (what the GPU figures measure) fuse element-wise chains and keep less, so compare
categories, and totals only between eager counts. GB is 1e9 bytes, as max_memory_allocated() / 1e9.
"""

import argparse
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import DeviceMesh

sys.path.insert(0, str(Path(__file__).parent))
from throughput.cases import Case, Shape, model_args
from throughput.step import build_ours, build_peer, host_batch, train_step

from flux_cluster.training import parallelize
from flux_cluster.training.parallelize import make_mesh

CATEGORIES = {
    "params": ("Parameter", "Sharded Param"),
    "gathered params": ("Unsharded Param", "All Gather"),
    "grads": ("Gradient", "Sharded Grad"),
    "unsharded grads": ("Unsharded Grad", "Reduce Scatter"),
    "optimizer": ("OptState", "Optstate"),
    "activations": ("Activation",),
    "temporaries": ("Temp", "Other"),
    "inputs": ("Inputs", "Buffer"),
}
"""The tracker's reference types, grouped as the report shows them (FSDP's names and plain ones)."""
DEFAULT_CASES = ("peer:full", "ours:full:float32", "ours:full", "ours:ops", "ours-fp8:ops")


@dataclass
class Accounting:
    """One case's step: the breakdown at its peak, and the total at the end of each phase, bytes."""

    label: str
    peak: dict[str, int]
    phases: dict[str, int] = field(default_factory=dict)
    peak_phase: str = ""
    """The phase (throughput.cases.PHASES) during which the peak fell."""

    @property
    def peak_total(self) -> int:
        return sum(self.peak.values())


def _grouped(snapshot: dict) -> dict[str, int]:
    names = {str(getattr(k, "value", k)): v for k, v in snapshot.items() if str(k) != "Total"}
    out = {category: sum(names.get(n, 0) for n in kinds) for category, kinds in CATEGORIES.items()}
    unknown = set(names) - {n for kinds in CATEGORIES.values() for n in kinds}
    out["temporaries"] += sum(names[n] for n in unknown)
    return out


@contextmanager
def _reduce_in(dtype: torch.dtype | None) -> Iterator[None]:
    """parallelize.reduce_dtype forced to ``dtype`` (None: as it is), looked up by each parallelize()."""
    chosen = parallelize.reduce_dtype
    if dtype is not None:
        parallelize.reduce_dtype = lambda *_: dtype
    try:
        yield
    finally:
        parallelize.reduce_dtype = chosen


def account(
    case: Case, shape: Shape, mesh: DeviceMesh, reduce_dtype: torch.dtype | None = None
) -> Accounting:
    """Count one step of ``case`` after one warm-up step (which creates AdamW's states); ``reduce_dtype``
    forces ours' gradient copy for the reduce (float32: as before parallelize.reduce_dtype)."""
    device = torch.device("cpu")
    with FakeTensorMode(allow_non_fake_inputs=True), _reduce_in(reduce_dtype):
        build = build_peer if case.impl == "peer" else build_ours
        trainer = build(case, shape.args, device, mesh, as_on_gpu=True)
        trainer.attention = "flash"  # what the GPU's 'auto' runs; the CPU's math kernel keeps more
        batch = host_batch(shape, case.micro_batch, cuda=False)
        train_step(trainer, batch, device, lambda _: None)
        if case.impl == "peer":
            tracker: MemTracker = MemTracker()
            tracker.track_external(trainer.model, trainer.optimizer)
        else:
            tracker = FSDPMemTracker(trainer.model, trainer.optimizer)
        phases: dict[str, int] = {}
        highest = [0, ""]

        def mark(phase: str) -> None:
            phases[phase] = tracker.get_tracker_snapshot("current")[device]["Total"]
            peak = tracker.get_tracker_snapshot("peak")[device]["Total"]
            if peak > highest[0]:
                highest[:] = [peak, phase]

        with tracker:
            train_step(trainer, batch, device, mark)
        peak = _grouped(tracker.get_tracker_snapshot("peak")[device])
    label = f"{case.label} {case.checkpointing}" + (" (float32 reduce)" if reduce_dtype else "")
    return Accounting(label, peak, phases, str(highest[1]))


def table(rows: list[Accounting], reference: Accounting | None = None) -> str:
    """Markdown: one row per case, GB by category at its peak, and the total against ``reference``."""
    head = ["case", *CATEGORIES, "peak GB", "peak in", "vs " + (reference.label if reference else "-")]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row in rows:
        ratio = f"{row.peak_total / reference.peak_total - 1:+.1%}" if reference else "-"
        cells = [f"{row.peak[c] / 1e9:.2f}" for c in CATEGORIES]
        total = f"{row.peak_total / 1e9:.2f} | {row.peak_phase}"
        lines.append(f"| {row.label} | " + " | ".join(cells) + f" | {total} | {ratio} |")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cases",
        default=",".join(DEFAULT_CASES),
        help="impl:mode[:float32],... (impl: ours, ours-fp8, peer; float32: ours' gradient copy for the "
        "reduce in float32, as before parallelize.reduce_dtype)",
    )
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--double", type=int, default=4)
    parser.add_argument("--single", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="the tiny preset, micro-batch 2")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
    if args.smoke:
        shape, micro_batch = Shape(model_args("tiny", 1, 1), latent=16, text_tokens=16), 2
    else:
        shape = Shape(model_args("flux-schnell", args.double, args.single), latent=32, text_tokens=256)
        micro_batch = args.micro_batch
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    mesh = make_mesh(torch.device("cpu"), 1, 1)
    rows = []
    for spec in args.cases.split(","):
        impl, mode, *reduce = spec.split(":")
        recipe = "tensorwise" if impl == "ours-fp8" else ""
        dtype = torch.float32 if reduce == ["float32"] else None
        row = account(Case(impl, micro_batch, mode, False, recipe), shape, mesh, dtype)
        phases = ", ".join(f"{p} {b / 1e9:.2f}" for p, b in row.phases.items())
        peak = f"peak {row.peak_total / 1e9:.2f} GB (in {row.peak_phase})"
        print(f"{row.label}: {peak}; after each phase: {phases}", flush=True)
        rows.append(row)
    dist.destroy_process_group()
    a = shape.args
    print(
        f"\nCPU accounting (eager, fake tensors), hidden {a.hidden}, {a.num_layers}+{a.num_single_layers} "
        f"blocks, micro-batch {micro_batch}, {shape.image_tokens}+{shape.text_tokens} tokens; GB at each "
        "case's peak:\n"
    )
    print(table(rows, rows[0]))


if __name__ == "__main__":
    main()
