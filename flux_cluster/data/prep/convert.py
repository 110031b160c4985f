"""convert: MLCommons preprocessed datasets -> webdataset shards in NVIDIA's layout.

The work is a list of (split, shard) items, train first. A Slurm array task takes a contiguous range of
it; within a task, worker processes convert one shard each. Finished shards are skipped, so a re-run
after a failure only does what is missing, and produces the same bytes.
"""

import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from flux_cluster.atomic import write_atomic
from flux_cluster.data.format import (
    DEFAULT_SHARD_SIZE,
    MEMBER_SUFFIXES,
    SPLITS,
    Split,
    sample_json,
    sample_key,
)
from flux_cluster.data.prep.parallel import Report, run_parallel
from flux_cluster.data.prep.progress import StageProgress
from flux_cluster.data.prep.shards import STATE_DIR, is_finished, shard_lock, write_shard
from flux_cluster.data.prep.source import Source, open_source
from flux_cluster.data.prep.synthetic import read_encoded_marker, read_marker
from flux_cluster.errors import FluxClusterError

PLAN_FILE = "plan.json"


@dataclass(frozen=True)
class ConversionPlan:
    """What a conversion produces. Every task computes it from the input; all must agree with the record."""

    source: str
    """Where the input was when the plan was made (for people; identity is the fingerprint)."""
    fingerprint: str
    """Hash of the input's file names, sizes and row counts (and the synthetic marker): the same data
    reached through another path or mount compares equal, changed data does not."""
    source_kind: str
    """'mlcommons', 'synthetic' for data made by 'flux-cluster data synth', or 'encoded' for a user's images
    encoded by 'flux-cluster data encode'."""
    dims: str | None
    """Synthetic data: the dims preset it was made with ('tiny' or 'real'); MLCommons data is 'real';
    encoded data None (the encoding model's shapes)."""
    shard_size: int
    samples: dict[str, int]

    def shards(self, split: Split) -> int:
        return math.ceil(self.samples[split] / self.shard_size)

    def work(self) -> list[tuple[Split, int]]:
        return [(split, shard) for split in SPLITS for shard in range(self.shards(split))]

    def task_work(self, task: int, tasks: int) -> list[tuple[Split, int]]:
        """Task ``task`` of ``tasks``: a contiguous range of the work, ranges as even as possible."""
        work = self.work()
        return work[task * len(work) // tasks : (task + 1) * len(work) // tasks]

    def key_offset(self, split: Split) -> int:
        """Sample names number the whole dataset, val after train: Energon refuses a key used twice."""
        return 0 if split == "train" else self.samples["train"]

    def shard_samples(self, split: Split, shard: int) -> int:
        return min(self.shard_size, self.samples[split] - shard * self.shard_size)

    @staticmethod
    def load(output: Path) -> "ConversionPlan | None":
        path = output / STATE_DIR / PLAN_FILE
        if not path.is_file():
            return None
        try:
            return ConversionPlan(**json.loads(path.read_text()))
        except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: JSON nested too deeply
            raise FluxClusterError(f"{path}: not a flux-cluster conversion plan ({exc})") from None


def make_plan(source_root: Path, shard_size: int = DEFAULT_SHARD_SIZE) -> ConversionPlan:
    """The plan for a source; checks the source (missing folders, schema, unreadable files)."""
    if shard_size < 1:
        raise FluxClusterError(f"shard size {shard_size}: expected a positive number of samples")
    _source.cache_clear()  # the input may have changed since this process last looked
    marker = read_marker(source_root)
    encoded = read_encoded_marker(source_root)
    sources = {split: _source(source_root, split) for split in SPLITS}
    return ConversionPlan(
        source=str(source_root.absolute()),
        fingerprint=_fingerprint(sources, marker or encoded),
        source_kind="synthetic" if marker else "encoded" if encoded else "mlcommons",
        # Encoded data has the shapes of the model that encoded it: no preset to check against.
        dims=marker["dims"] if marker else None if encoded else "real",
        shard_size=shard_size,
        samples={split: source.total for split, source in sources.items()},
    )


def _fingerprint(sources: dict[Split, Source], marker: dict | None) -> str:
    digest = hashlib.sha256(json.dumps(marker, sort_keys=True).encode())
    for split, source in sources.items():
        for file in source.files:
            name = file.path.relative_to(source.directory)
            digest.update(f"{split}/{name}:{file.path.stat().st_size}:{file.rows}\n".encode())
    return digest.hexdigest()[:16]


def record_plan(output: Path, plan: ConversionPlan) -> None:
    """Write the plan, or check that the output was converted under the same plan."""
    existing = ConversionPlan.load(output)
    check_compatible(output, existing, plan)
    try:
        (output / STATE_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FluxClusterError(f"{output}: cannot write the output ({exc.strerror})") from None
    if existing is None:
        write_atomic(output / STATE_DIR / PLAN_FILE, json.dumps(asdict(plan), indent=1) + "\n")


def check_compatible(output: Path, existing: ConversionPlan | None, plan: ConversionPlan) -> None:
    """An output holds one conversion: refuse to mix in shards of other data or another shard size."""
    if existing is None or (existing.fingerprint, existing.shard_size) == (plan.fingerprint, plan.shard_size):
        return
    raise FluxClusterError(
        f"{output / STATE_DIR / PLAN_FILE}: {output} holds a conversion of other data or with another "
        f"shard size ({existing.source}: {existing.samples}, shard size {existing.shard_size}, data "
        f"{existing.fingerprint}; now {plan.source}: {plan.samples}, shard size {plan.shard_size}, data "
        f"{plan.fingerprint}); use another --output or remove {output}"
    )


def convert(
    source_root: Path,
    output: Path,
    *,
    shard_size: int | None = None,
    task: int = 0,
    tasks: int = 1,
    workers: int = 1,
) -> ConversionPlan:
    """Convert this task's range of shards; returns the plan. Without a shard size, the one an earlier
    run recorded in the output is kept (else NVIDIA's 10,000)."""
    if not 0 <= task < tasks:
        raise FluxClusterError(f"task {task} of {tasks}: expected 0 <= task < tasks")
    if shard_size is None:
        recorded = ConversionPlan.load(output)
        shard_size = recorded.shard_size if recorded else DEFAULT_SHARD_SIZE
    plan = make_plan(source_root, shard_size)
    record_plan(output, plan)
    mine = plan.task_work(task, tasks)
    todo = [(split, shard) for split, shard in mine if not is_finished(output, split, shard)]
    skipped = sum(plan.shard_samples(split, shard) for split, shard in mine if (split, shard) not in todo)
    label = f"convert (task {task + 1}/{tasks})" if tasks > 1 else "convert"
    total = sum(plan.shard_samples(split, shard) for split, shard in todo)
    with StageProgress(label, total) as progress:
        if skipped:
            progress.console.print(
                f"{label}: {len(mine) - len(todo)} shard(s), {skipped:,} samples already done"
            )
        items = [
            (str(source_root), str(output), split, shard, plan.shard_size, plan.key_offset(split))
            for split, shard in todo
        ]
        run_parallel(_convert_shard, items, workers, progress)
    return plan


def _convert_shard(item: tuple[str, str, Split, int, int, int], report: Report) -> int:
    source_root, output, split, shard, shard_size, key_offset = item
    source = _source(Path(source_root), split)
    first = shard * shard_size
    stop = min(first + shard_size, source.total)
    timesteps: Counter[int] = Counter()
    with shard_lock(Path(output), split, shard):  # another task or run may be on the same shard
        if is_finished(Path(output), split, shard):
            return 0
        members = _members(source, first, stop, key_offset, timesteps, report)
        write_shard(Path(output), split, shard, first, members, timesteps)
    return stop - first


def _members(
    source: Source, first: int, stop: int, key_offset: int, timesteps: Counter[int], report: Report
) -> Iterator[tuple[str, bytes | memoryview]]:
    pending_samples = pending_bytes = 0
    for index, row in enumerate(source.rows(first, stop), start=first + key_offset):
        name = sample_key(index)
        if row.timestep is not None:
            timesteps[row.timestep] += 1
        yield f"{name}.json", sample_json(row.key, row.timestep)
        for column, suffix in sorted(MEMBER_SUFFIXES.items(), key=lambda kv: kv[1]):
            if column not in row.tensors:
                continue  # the control latents: edit pairs only
            yield f"{name}.{suffix}", row.tensors[column]
            pending_bytes += len(row.tensors[column])
        pending_samples += 1
        if pending_samples >= 16:
            report(pending_samples, pending_bytes)
            pending_samples = pending_bytes = 0
    if pending_samples:
        report(pending_samples, pending_bytes)


@cache
def _source(source_root: Path, split: Split) -> Source:
    """Opened once per process: describing Arrow files reads their batch headers."""
    return open_source(source_root, split)
