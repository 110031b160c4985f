"""Throughput of the data pipeline (convert, index, loader) against a raw copy of the same bytes, same run.

    .venv/bin/python benchmarks/data_prep.py [--samples 1500] [--workers 1,2] [--repeats 3] [--json PATH]

Makes real-dims synthetic data (about 2 MB a sample) in a scratch folder, then:

- copies every source file, fsync'ing each (as convert fsyncs each shard), two ways: streamed through
  a 1 MiB buffer (like cat): the baseline, since convert also writes every byte through write();
  and with sendfile, in-kernel, for scale;
- converts the same data in a fresh child process per worker count (the code path of
  'prepare-data --stage convert'), timing it inside the child and taking its peak RSS from wait4;
- repeats copies and conversions in --repeats interleaved rounds, deleting each output at once, and
  keeps each step's best run (writes on this kind of VM are several times slower when they need
  fresh memory from the host, which makes single runs erratic);
- profiles one shard's conversion in this process (--profile-top 0 skips it);
- indexes the output for Energon and reads it back with the train loader (real dims, batch 8).

The page cache cannot be dropped without root: the source stays cached after synthesis, so every
step reads it from memory and the copy baseline measures the write path.
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from data_pipeline.measure import (
    MB,
    copy_and_convert,
    gpu_need_samples_per_s,
    index_step,
    measure_loader,
    profile_one_shard,
    tree_bytes,
)
from data_pipeline.report import figures, print_report
from rich.console import Console

from flux_cluster.data.format import DIMS
from flux_cluster.data.prep.synthetic import synthesize


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=1500, help="train samples (about 2 MB each)")
    parser.add_argument("--val", type=int, default=64, help="val samples")
    parser.add_argument("--rows-per-file", type=int, default=200, help="source rows per Arrow file")
    parser.add_argument("--shard-size", type=int, default=250)
    parser.add_argument("--workers", default="1,2", help="convert worker counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of copies and conversions")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5, help="loader batches before timing")
    parser.add_argument("--batches", type=int, default=50, help="loader batches timed")
    parser.add_argument(
        "--loader-workers", default="0,4", help="loader worker counts (4: the job's train.loader_workers)"
    )
    parser.add_argument("--profile-top", type=int, default=5, help="cProfile entries of one shard (0: skip)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()), help="scratch parent")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]
    args.loader_workers = [int(w) for w in args.loader_workers.split(",")]
    console = Console()
    if not console.is_terminal:
        console.width = 130  # rich's default off a terminal, 80, wraps the table
    began = time.perf_counter()

    # Source, an output and a copy live at once: check for room first.
    estimate = (args.samples + args.val) * DIMS["real"].sample_bytes()
    args.workdir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.workdir).free
    if free < 3 * estimate:
        sys.exit(f"{args.workdir}: {free / 1e9:.1f} GB free, need about {3 * estimate / 1e9:.1f} GB")
    work = Path(tempfile.mkdtemp(prefix="flux-bench-data-prep-", dir=args.workdir))
    console.print(f"scratch folder: {work}")
    try:
        figures = run(args, worker_counts, work, console)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    figures["total_seconds"] = time.perf_counter() - began
    console.print(f"total run time: {figures['total_seconds']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
        console.print(f"figures written to {args.json}")


def run(args: argparse.Namespace, worker_counts: list[int], work: Path, console: Console) -> dict[str, Any]:
    source = work / "source"
    samples = args.samples + args.val
    start = time.perf_counter()
    synthesize(
        source, train=args.samples, val=args.val, dims="real", seed=0, rows_per_file=args.rows_per_file
    )
    synth_seconds = time.perf_counter() - start
    nbytes = tree_bytes(source)
    arrow_files = len(list(source.rglob("*.arrow")))
    console.print(
        f"synthesized {samples:,} samples, {nbytes / MB:,.0f} MB in {arrow_files} Arrow files "
        f"({synth_seconds:.0f} s)"
    )
    rounds = copy_and_convert(source, work, args.shard_size, worker_counts, args.repeats, samples, nbytes)

    profile: tuple[list[dict[str, Any]], float] = ([], 0.0)
    if args.profile_top > 0:
        profile = profile_one_shard(source, work / "energon-profile", args.shard_size, args.profile_top)
        shutil.rmtree(work / "energon-profile")

    output = work / "energon"
    indexed = index_step(output, source, samples, max(worker_counts))
    loader_steps, loader_setups = [], []
    for workers in args.loader_workers:
        loader_step, loader_setup = measure_loader(
            output, args.batch_size, args.warmup, args.batches, workers
        )
        loader_steps.append(loader_step)
        loader_setups.append(loader_setup)
    need = gpu_need_samples_per_s(0.5, 989.0)

    steps = [*rounds.best.values(), indexed, *loader_steps]
    print_report(console, args, rounds, steps, (loader_steps, loader_setups), need, profile)
    made = {
        "samples": samples,
        "source_bytes": nbytes,
        "arrow_files": arrow_files,
        "synth_seconds": synth_seconds,
    }
    return figures(args, made, rounds, steps, loader_setups, need, profile)


if __name__ == "__main__":
    main()
