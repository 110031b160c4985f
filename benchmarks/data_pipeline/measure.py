"""The steps benchmarks/data_prep.py measures: raw copies, conversions in a child process, rounds of
both, one shard profiled, the index and the train loader."""

import cProfile
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import psutil  # comes with megatron-energon (via multi-storage-client)

from flux_cluster.data.format import DIMS
from flux_cluster.data.prep.convert import convert, make_plan
from flux_cluster.data.prep.index import index

COPY_CHUNK = 1 << 20

POLL_S = 0.1

MB = 1e6

CopyMethod = Literal["stream", "sendfile"]

# Run in the child: convert, timed after the imports, the result written as JSON.
CHILD = """
import json, resource, sys, time
from pathlib import Path
from flux_cluster.data.prep.convert import convert
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
    from flux_cluster.data.loader import train_loader  # torch and Energon: imported only here

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
    from flux_cluster.config.workload import load_workload
    from flux_cluster.training.flops import training_flops_per_sample

    shape = load_workload("flux1")[0].models["flux-schnell"].shape()
    return mfu * peak_tflops * 1e12 / training_flops_per_sample(shape)


@dataclass
class Rounds:
    """Copies and conversions, each measured ``repeats`` times in interleaved rounds."""

    runs: dict[str, list[Step]]
    """Every run of each step, by step name."""
    best: dict[str, Step]
    """Each step's fastest run, with the worst run's peak memory."""
    identical: bool
    """Whether every conversion wrote the same shards (same plan, whatever the worker count)."""

    @property
    def baseline(self) -> Step:
        return self.best["raw copy, stream"]  # like convert, it pushes every byte through write()


def copy_and_convert(
    source: Path,
    work: Path,
    shard_size: int,
    worker_counts: list[int],
    repeats: int,
    samples: int,
    nbytes: int,
) -> Rounds:
    """Rounds of (copies, conversions), each output deleted at once, so every step starts alike; the best
    run of each step counts. The last conversion's output stays in work/energon, to be indexed."""
    # The first big write after synthesis is slow whatever writes it (fresh memory): an untimed copy.
    raw_copy(source, work / "copy", samples, "stream")
    methods: tuple[CopyMethod, ...] = ("stream", "sendfile")
    runs: dict[str, list[Step]] = {}
    hashes: list[dict[str, str]] = []
    output = work / "energon"
    for repeat in range(repeats):
        for method in methods:
            step = raw_copy(source, work / "copy", samples, method)
            runs.setdefault(step.name, []).append(step)
        for workers in worker_counts:
            log = work / f"convert-w{workers}.log"
            step = convert_in_child(source, output, shard_size, workers, samples, nbytes, log)
            runs.setdefault(step.name, []).append(step)
            hashes.append(shard_hashes(output))
            if not (repeat == repeats - 1 and workers == worker_counts[-1]):
                shutil.rmtree(output)  # the last one is indexed
    best: dict[str, Step] = {}
    for name, measured in runs.items():
        fastest = max(measured, key=lambda step: step.mb_per_s)
        rss = [step.peak_rss_mb for step in measured if step.peak_rss_mb is not None]
        anon = [step.peak_anon_mb for step in measured if step.peak_anon_mb is not None]
        best[name] = replace(  # memory: the worst run's
            fastest, peak_rss_mb=max(rss) if rss else None, peak_anon_mb=max(anon) if anon else None
        )
    return Rounds(runs, best, all(h == hashes[0] for h in hashes))


def index_step(output: Path, source: Path, samples: int, workers: int) -> Step:
    """Index the converted output for Energon, timed."""
    shard_bytes = tree_bytes(output)
    start, cpu = time.perf_counter(), cpu_now()
    shards = index(output, source, workers=workers)
    seconds = time.perf_counter() - start
    return Step(f"index, {len(shards)} shards", seconds, samples, shard_bytes, **cpu_since(cpu))
