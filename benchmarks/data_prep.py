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
import cProfile
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import psutil  # comes with megatron-energon (via multi-storage-client)
from rich import box
from rich.console import Console
from rich.table import Table

# This script shares its name with the data_prep package: drop its own folder from the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from data_prep.convert import convert, make_plan  # noqa: E402
from data_prep.format import DIMS  # noqa: E402
from data_prep.index import index  # noqa: E402
from data_prep.synthetic import synthesize  # noqa: E402

COPY_CHUNK = 1 << 20
POLL_S = 0.1
MB = 1e6
CopyMethod = Literal["stream", "sendfile"]

# Run in the child: convert, timed after the imports, the result written as JSON.
CHILD = """
import json, resource, sys, time
from pathlib import Path
from data_prep.convert import convert
def cpu():
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + kids.ru_utime, own.ru_stime + kids.ru_stime
source, output, shard_size, workers, result = sys.argv[1:6]
start, (user, system) = time.perf_counter(), cpu()
convert(Path(source), Path(output), shard_size=int(shard_size), workers=int(workers))
seconds, (user2, system2) = time.perf_counter() - start, cpu()
timing = {"seconds": seconds, "cpu_seconds": user2 - user + system2 - system, "sys_seconds": system2 - system}
Path(result).write_text(json.dumps(timing))
"""


@dataclass
class Step:
    """One measured step; rates are per second of ``seconds``."""

    name: str
    seconds: float
    samples: int
    nbytes: int
    peak_rss_mb: float | None = None
    """Largest single process (ru_maxrss from wait4; counts mapped source pages it touched)."""
    peak_anon_mb: float | None = None
    """Anonymous (heap) RSS summed over the process tree, polled every POLL_S."""
    wall_seconds: float | None = None
    """Child processes: including interpreter start and imports."""
    cpu_seconds: float | None = None
    """User + system CPU over ``seconds``, of this process and the children it reaped."""
    sys_seconds: float | None = None
    """The system part of ``cpu_seconds``: the kernel's copies, page faults, fsync."""

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / MB / self.seconds


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def cpu_now() -> tuple[float, float]:
    """(user, system) CPU seconds of this process and its reaped children so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + children.ru_utime, own.ru_stime + children.ru_stime


def cpu_since(mark: tuple[float, float]) -> dict[str, float]:
    """Step fields for the CPU used since ``mark`` (from cpu_now)."""
    user, system = cpu_now()
    return {"cpu_seconds": user - mark[0] + system - mark[1], "sys_seconds": system - mark[1]}


def raw_copy(source: Path, target: Path, samples: int, method: CopyMethod) -> Step:
    """Copy every file under ``source`` to ``target``, fsync'ing each one.

    stream: read/write through a 1 MiB buffer (shutil.copyfileobj, like cat);
    sendfile: in-kernel, no user-space copy (what shutil.copyfile does on Linux)."""
    files = sorted(p for p in source.rglob("*") if p.is_file())
    start, cpu = time.perf_counter(), cpu_now()
    for path in files:
        destination = target / path.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "rb") as reader, open(destination, "wb") as writer:
            if method == "stream":
                shutil.copyfileobj(reader, writer, COPY_CHUNK)
                writer.flush()
            else:
                size, offset = os.fstat(reader.fileno()).st_size, 0
                while offset < size:
                    offset += os.sendfile(writer.fileno(), reader.fileno(), offset, size - offset)
            os.fsync(writer.fileno())
    seconds, used = time.perf_counter() - start, cpu_since(cpu)
    nbytes = sum(p.stat().st_size for p in files)
    shutil.rmtree(target)
    return Step(f"raw copy, {method}", seconds, samples, nbytes, **used)


class TreeMemory(threading.Thread):
    """Polls the anonymous RSS of a process and its descendants; keeps the peak of the sum."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(POLL_S):
            try:
                root = psutil.Process(self.pid)
                processes = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            total = 0
            for process in processes:
                try:
                    info = process.memory_info()
                    total += info.rss - info.shared  # shared: file-backed and shmem pages
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)


def convert_in_child(
    source: Path, output: Path, shard_size: int, workers: int, samples: int, nbytes: int, log: Path
) -> Step:
    result = output.parent / f"{output.name}.result.json"
    command = [
        sys.executable,
        "-P",  # no current folder on the path: it may be this one
        "-c",
        CHILD,
        str(source),
        str(output),
        str(shard_size),
        str(workers),
        str(result),
    ]
    start = time.perf_counter()
    with open(log, "wb") as log_file:
        child = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        memory = TreeMemory(child.pid)
        memory.start()
        # wait4 gives this child's own rusage; its ru_maxrss covers the workers it reaped.
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        memory.done.set()
        memory.join()
    wall = time.perf_counter() - start
    if child.returncode != 0:
        sys.exit(f"convert (workers={workers}) failed with status {child.returncode}:\n{log.read_text()}")
    timing = json.loads(result.read_text())
    return Step(
        f"convert, workers={workers}",
        timing["seconds"],
        samples,
        nbytes,
        cpu_seconds=timing["cpu_seconds"],
        sys_seconds=timing["sys_seconds"],
        peak_rss_mb=usage.ru_maxrss * 1024 / MB,  # KiB on Linux
        peak_anon_mb=memory.peak / MB,
        wall_seconds=wall,
    )


def shard_hashes(output: Path) -> dict[str, str]:
    records = sorted((output / ".flux-prep").glob("*/*.json"))
    return {str(p.relative_to(output)): json.loads(p.read_text())["sha256"] for p in records}


def profile_one_shard(
    source: Path, output: Path, shard_size: int, top: int
) -> tuple[list[dict[str, Any]], float]:
    """cProfile of converting the first shard in this process (task 0 of one task per shard)."""
    shards = len(make_plan(source, shard_size).work())
    profiler = cProfile.Profile()
    profiler.enable()
    convert(source, output, shard_size=shard_size, task=0, tasks=shards, workers=1)
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in stats.stats.values())  # type: ignore[attr-defined]
    entries = [
        {
            "function": name if file == "~" else f"{Path(file).name}:{line}({name})",  # ~: built-ins
            "calls": calls,
            "tottime_s": tottime,
            "cumtime_s": cumtime,
            "share": tottime / total,
        }
        for (file, line, name), (_, calls, tottime, cumtime, _) in rows
    ]
    return entries, total


def measure_loader(
    root: Path, batch_size: int, warmup: int, batches: int, workers: int
) -> tuple[Step, float]:
    """Train-loader throughput after ``warmup`` batches; also returns the loader's set-up time."""
    from data_prep.loader import train_loader  # torch and Energon: imported only here

    dims = DIMS["real"]
    start = time.perf_counter()
    loader = train_loader(
        root, batch_size=batch_size, rank=0, world_size=1, seed=0, num_workers=workers, dims=dims
    )
    batches_iter = iter(loader)
    for _ in range(warmup):
        next(batches_iter)
    setup = time.perf_counter() - start
    start, cpu = time.perf_counter(), cpu_now()
    for _ in range(batches):
        batch = next(batches_iter)
        assert batch.t5.shape == (batch_size, dims.t5_tokens, dims.t5_dim)
    seconds, used = time.perf_counter() - start, cpu_since(cpu)
    samples = batches * batch_size
    step = Step(f"train loader, workers={workers}", seconds, samples, samples * dims.sample_bytes(), **used)
    return step, setup


def gpu_need_samples_per_s(mfu: float, peak_tflops: float) -> float:
    """Samples/s one GPU consumes training full-depth flux-schnell at ``mfu`` of ``peak_tflops``."""
    from flux_cluster.training.flops import training_flops_per_sample
    from flux_cluster.training.workload import load_workload

    shape = load_workload("flux1")[0].models["flux-schnell"].shape()
    return mfu * peak_tflops * 1e12 / training_flops_per_sample(shape)


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

    # The first big write after synthesis is slow whatever writes it (fresh memory): an untimed copy.
    raw_copy(source, work / "copy", samples, "stream")
    # Rounds of (copies, conversions), each output deleted at once, so every step starts alike;
    # the best run of each step counts.
    methods: tuple[CopyMethod, ...] = ("stream", "sendfile")
    runs: dict[str, list[Step]] = {}
    hashes: list[dict[str, str]] = []
    output = work / "energon"
    for repeat in range(args.repeats):
        for method in methods:
            step = raw_copy(source, work / "copy", samples, method)
            runs.setdefault(step.name, []).append(step)
        for workers in worker_counts:
            log = work / f"convert-w{workers}.log"
            step = convert_in_child(source, output, args.shard_size, workers, samples, nbytes, log)
            runs.setdefault(step.name, []).append(step)
            hashes.append(shard_hashes(output))
            if not (repeat == args.repeats - 1 and workers == worker_counts[-1]):
                shutil.rmtree(output)  # the last one is indexed below
    best: dict[str, Step] = {}
    for name, measured in runs.items():
        fastest = max(measured, key=lambda step: step.mb_per_s)
        rss = [step.peak_rss_mb for step in measured if step.peak_rss_mb is not None]
        anon = [step.peak_anon_mb for step in measured if step.peak_anon_mb is not None]
        best[name] = replace(  # memory: the worst run's
            fastest, peak_rss_mb=max(rss) if rss else None, peak_anon_mb=max(anon) if anon else None
        )
    baseline = best["raw copy, stream"]  # like convert, it pushes every byte through write()
    identical = all(h == hashes[0] for h in hashes)  # same plan, same bytes, whatever the worker count

    profile: list[dict[str, Any]] = []
    profiled = 0.0
    if args.profile_top > 0:
        profile, profiled = profile_one_shard(
            source, work / "energon-profile", args.shard_size, args.profile_top
        )
        shutil.rmtree(work / "energon-profile")

    shard_bytes = tree_bytes(output)
    start, cpu = time.perf_counter(), cpu_now()
    shards = index(output, source, workers=max(worker_counts))
    index_step = Step(
        f"index, {len(shards)} shards",
        time.perf_counter() - start,
        samples,
        shard_bytes,
        **cpu_since(cpu),
    )
    loader_steps, loader_setups = [], []
    for workers in args.loader_workers:
        loader_step, loader_setup = measure_loader(
            output, args.batch_size, args.warmup, args.batches, workers
        )
        loader_steps.append(loader_step)
        loader_setups.append(loader_setup)
    need = gpu_need_samples_per_s(0.5, 989.0)

    steps = [*best.values(), index_step, *loader_steps]
    table = Table(box=box.SIMPLE, title="data preparation, real dims")
    columns = (
        "step",
        "s",
        "CPU (sys) s",
        "samples/s",
        "MB/s",
        "vs copy",
        "peak RSS MB",
        "peak anon MB",
        "runs MB/s",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "step" else "right")
    for step in steps:
        table.add_row(
            step.name + (" (baseline)" if step is baseline else ""),
            f"{step.seconds:.1f}",
            "-" if step.cpu_seconds is None else f"{step.cpu_seconds:.1f} ({step.sys_seconds:.1f})",
            f"{step.samples_per_s:,.1f}",
            f"{step.mb_per_s:,.0f}",
            f"{step.mb_per_s / baseline.mb_per_s:.2f}x",
            "-" if step.peak_rss_mb is None else f"{step.peak_rss_mb:,.0f}",
            "-" if step.peak_anon_mb is None else f"{step.peak_anon_mb:,.0f}",
            " ".join(f"{r.mb_per_s:.0f}" for r in runs.get(step.name, [])),
        )
    console.print(table)
    console.print(
        f"best of {args.repeats} interleaved rounds for copies and conversions (peak memory: the worst run); "
        "the streamed copy is the baseline (sendfile, no user-space copy, for scale). The source stays "
        "page-cached throughout; every written file is fsync'd. Peak RSS: largest process, counting the "
        "mapped source pages it touched; peak anon: heap summed over the process tree. CPU: user + sys."
    )
    console.print(f"convert outputs identical across runs and worker counts: {'yes' if identical else 'NO'}")
    console.print(
        f"loader set-up and {args.warmup} warm-up batches: "
        + ", ".join(f"{s:.1f} s" for s in loader_setups)
        + f"; timed {args.batches} batches of {args.batch_size} each, one rank's loader"
    )
    console.print(
        f"one GPU training full-depth flux-schnell at 50% MFU of 989 TFLOP/s (H100) consumes {need:.1f} "
        "samples/s; this rank's loader gives "
        + ", ".join(
            f"{s.samples_per_s:.0f} with {s.name.split(', ')[1]} ({s.samples_per_s / need:.1f}x)"
            for s in loader_steps
        )
    )
    if profile:
        top = Table(
            box=box.SIMPLE,
            title="cProfile, one shard converted in-process, by own time",
            caption=f"{profiled:.2f} s profiled in all (shard 0, {args.shard_size} samples)",
        )
        for column in ("function", "calls", "own s", "cum s", "share"):
            top.add_column(column, justify="left" if column == "function" else "right")
        for entry in profile:
            top.add_row(
                entry["function"],
                f"{entry['calls']:,}",
                f"{entry['tottime_s']:.2f}",
                f"{entry['cumtime_s']:.2f}",
                f"{entry['share']:.0%}",
            )
        console.print(top)

    return {
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "samples": samples,
        "source_bytes": nbytes,
        "arrow_files": arrow_files,
        "synth_seconds": synth_seconds,
        "runs": {
            name: [asdict(r) | {"mb_per_s": r.mb_per_s} for r in measured] for name, measured in runs.items()
        },
        "baseline": baseline.name,
        "steps": [
            asdict(s)
            | {
                "samples_per_s": s.samples_per_s,
                "mb_per_s": s.mb_per_s,
                "vs_copy": s.mb_per_s / baseline.mb_per_s,
            }
            for s in steps
        ],
        "outputs_identical": identical,
        "loader_setup_seconds": loader_setups,
        "gpu_need_samples_per_s": need,
        "profile_one_shard": profile,
        "profile_total_seconds": profiled,
    }


if __name__ == "__main__":
    main()
