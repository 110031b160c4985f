"""verify: read every shard once and check it against what conversion recorded and what flux1 needs.

Per shard: the tar reads to the end, every sample has its five members, every tensor member is an
np.save'd uint16 array of the expected shape, the sample names run on without gaps, and the bytes hash
to the recorded sha256. Per split: the sample totals (MLCommons: 1,099,776 train, 29,696 val), val
timesteps balanced, no stray shards, index.txt and Energon's counts in agreement, empty encodings present.
"""

import hashlib
import json
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
from rich.console import Console
from rich.table import Table

from flux_cluster.console import print_table
from flux_cluster.data.format import (
    CONTROL_MEMBER,
    DIMS,
    EMPTY_DIR,
    EMPTY_FILES,
    INDEX_FILE,
    MLCOMMONS_TOTALS,
    SPLITS,
    TENSOR_COLUMNS,
    VAL_TIMESTEPS,
    FormatError,
    Split,
    decode_tensor,
    sample_key,
    shard_name,
)
from flux_cluster.data.prep.convert import ConversionPlan
from flux_cluster.data.prep.index import NV_META
from flux_cluster.data.prep.parallel import Report, run_parallel
from flux_cluster.data.prep.progress import StageProgress
from flux_cluster.data.prep.shards import ShardRecord, shard_path
from flux_cluster.errors import FluxClusterError

_SUFFIX_SHAPE_COLUMN = {suffix: column for column, suffix in TENSOR_COLUMNS.items()}
_MEMBERS = {"json", *_SUFFIX_SHAPE_COLUMN}
_OPTIONAL = {CONTROL_MEMBER: "mean"}
"""Members a sample may have (edit pairs), with the column whose shape they share."""
MAX_SHOWN = 20
PER_SHARD_SHOWN = 3


@dataclass
class ShardCheck:
    split: str
    shard: int
    samples: int = 0
    nbytes: int = 0
    timesteps: Counter[int] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    controls: int = 0
    """Samples with a control latent (edit pairs): a dataset has one in every sample or in none."""


class _HashingReader:
    """Feeds everything tarfile reads into a hash, so a shard is read once."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream, self.hash, self.nbytes = stream, hashlib.sha256(), 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.hash.update(data)
        self.nbytes += len(data)
        return data

    def drain(self) -> None:
        while self.read(1 << 22):
            pass


def check_shard(item: tuple[str, Split, int, int, str | None], report: Report) -> ShardCheck:
    root, split, shard, first_key, dims_name = item
    path = shard_path(Path(root), split, shard)
    check = ShardCheck(split, shard)
    shapes = DIMS[dims_name].shapes() if dims_name else {}
    record = ShardRecord.load(Path(root), split, shard)
    if record is None:
        check.problems.append(f"{path}: no conversion record (the shard was never finished)")
    try:
        with open(path, "rb") as raw:
            reader = _HashingReader(raw)
            _check_members(reader, path, split, first_key, shapes, check, report)
            reader.drain()
    except FileNotFoundError:
        check.problems.append(f"{path}: missing")
        return check
    check.nbytes = reader.nbytes
    if record is not None:
        if record.samples != check.samples:
            check.problems.append(f"{path}: {check.samples} samples, conversion recorded {record.samples}")
        if record.sha256 != reader.hash.hexdigest():
            check.problems.append(
                f"{path}: contents differ from what conversion wrote (sha256 mismatch); "
                f"delete it and run the convert stage again"
            )
    return check


def _check_members(
    reader: _HashingReader,
    path: Path,
    split: Split,
    first_key: int,
    shapes: dict[str, tuple[int, ...]],
    check: ShardCheck,
    report: Report,
) -> None:
    current: str | None = None
    seen: set[str] = set()
    member = "(start)"

    def close_sample() -> None:
        if current is None:
            return
        if seen - set(_OPTIONAL) != _MEMBERS:
            missing = ", ".join(sorted(_MEMBERS - seen)) or "-"
            check.problems.append(f"{path}: sample {current}: members missing: {missing}")
        check.controls += CONTROL_MEMBER in seen
        expected = sample_key(first_key + check.samples)
        if current != expected:
            check.problems.append(f"{path}: sample {current} where {expected} was expected")
        check.samples += 1

    try:
        with tarfile.open(fileobj=reader, mode="r|") as archive:  # type: ignore[call-overload]
            for info in archive:
                member = info.name
                key, _, suffix = member.partition(".")
                if key != current:
                    close_sample()
                    current, seen = key, set()
                    report(1, 0)
                seen.add(suffix)
                data = archive.extractfile(info).read() if info.isfile() else b""
                report(0, len(data))
                _check_payload(data, suffix, split, shapes, check, f"{path}: member {member}")
        close_sample()
    except (tarfile.TarError, EOFError, OSError) as exc:
        check.problems.append(f"{path}: truncated or corrupt tar in or after member {member} ({exc})")


def _check_payload(
    data: bytes, suffix: str, split: Split, shapes: dict[str, tuple[int, ...]], check: ShardCheck, where: str
) -> None:
    if suffix == "json":
        try:
            record = json.loads(data)
            if not isinstance(record.get("key"), str):
                raise ValueError("no string 'key'")
            if split == "val":
                timestep = record.get("timestep")
                if not isinstance(timestep, int) or not 0 <= timestep < VAL_TIMESTEPS:
                    raise ValueError(f"timestep {timestep!r}, expected 0..{VAL_TIMESTEPS - 1}")
                check.timesteps[timestep] += 1
        except (ValueError, AttributeError, RecursionError) as exc:  # RecursionError: nested too deeply
            check.problems.append(f"{where}: bad json ({exc})")
    elif suffix in _SUFFIX_SHAPE_COLUMN or suffix in _OPTIONAL:
        try:
            decode_tensor(data, shapes.get(_SUFFIX_SHAPE_COLUMN.get(suffix) or _OPTIONAL[suffix]))
        except FormatError as exc:
            check.problems.append(f"{where}: {exc}")
    else:
        check.problems.append(f"{where}: unexpected member")


@dataclass
class SplitSummary:
    split: str
    shards: int
    samples: int
    expected: int
    nbytes: int
    timesteps: Counter[int]
    ok: bool


def verify(output: Path, workers: int = 1, console: Console | None = None) -> bool:
    """Check everything; print a summary table and the problems found; True when all is well."""
    console = console or Console(stderr=True)
    plan = ConversionPlan.load(output)
    if plan is None:
        raise FluxClusterError(f"{output}: no conversion recorded there; run the convert stage first")
    items = [
        (str(output), split, shard, _first_key(plan, split, shard), plan.dims) for split, shard in plan.work()
    ]
    with StageProgress("verify", sum(plan.samples.values()), console) as progress:
        checks: list[ShardCheck] = run_parallel(check_shard, items, workers, progress)
    problems: list[str] = []  # the split-level ones first: they summarise what the shard-level ones detail
    summaries = []
    for split in SPLITS:
        split_problems = _split_problems(output, plan, split, [c for c in checks if c.split == split])
        problems += split_problems
        mine = [c for c in checks if c.split == split]
        summaries.append(
            SplitSummary(
                split,
                len(mine),
                sum(c.samples for c in mine),
                plan.samples[split],
                sum(c.nbytes for c in mine),
                sum((c.timesteps for c in mine), Counter()),
                not split_problems and not any(c.problems for c in mine),
            )
        )
    problems += _root_problems(output, plan) + control_problems(output, checks)
    for check in checks:
        problems += check.problems[:PER_SHARD_SHOWN]
        if len(check.problems) > PER_SHARD_SHOWN:
            path = shard_path(output, check.split, check.shard)  # type: ignore[arg-type]
            problems.append(f"{path}: {len(check.problems) - PER_SHARD_SHOWN} more problem(s) in this shard")
    _print_summary(console, output, plan, summaries, problems)
    return not problems


def control_problems(output: Path, checks: list[ShardCheck]) -> list[str]:
    """Edit pairs are all or nothing: a batch mixing samples with and without a control latent has
    nothing to condition some of its samples on."""
    samples, controls = sum(c.samples for c in checks), sum(c.controls for c in checks)
    if 0 < controls < samples:
        return [
            f"{output}: {controls:,} of {samples:,} samples have a {CONTROL_MEMBER} (edit pairs); "
            f"expected every sample or none"
        ]
    return []


def _first_key(plan: ConversionPlan, split: Split, shard: int) -> int:
    return plan.key_offset(split) + shard * plan.shard_size


def _split_problems(output: Path, plan: ConversionPlan, split: Split, checks: list[ShardCheck]) -> list[str]:
    problems = []
    samples = sum(c.samples for c in checks)
    if samples != plan.samples[split]:
        problems.append(f"{output / split}: {samples:,} samples, the source has {plan.samples[split]:,}")
    if plan.source_kind == "mlcommons" and samples != MLCOMMONS_TOTALS[split]:
        problems.append(
            f"{output / split}: {samples:,} samples, "
            f"the MLCommons {split} set has {MLCOMMONS_TOTALS[split]:,}"
        )
    expected = {shard_name(s) for s in range(plan.shards(split))}
    stray = sorted(p.name for p in (output / split).glob("shard_*.tar") if p.name not in expected)
    if stray:
        problems.append(f"{output / split}: shards the conversion did not make: {', '.join(stray[:5])}")
    index = output / split / INDEX_FILE
    if not index.is_file():
        problems.append(f"{index}: missing (run the index stage)")
    elif index.read_text().split() != sorted(expected):
        problems.append(f"{index}: does not list exactly the split's shards")
    if split == "val":
        timesteps = sum((c.timesteps for c in checks), Counter())
        problems += _timestep_problems(output / split, plan, timesteps)
    return problems


def _timestep_problems(where: Path, plan: ConversionPlan, timesteps: Counter[int]) -> list[str]:
    counts = [timesteps.get(t, 0) for t in range(VAL_TIMESTEPS)]
    if plan.source_kind == "mlcommons":
        per = MLCOMMONS_TOTALS["val"] // VAL_TIMESTEPS
        if any(c != per for c in counts):
            return [f"{where}: samples per timestep {counts}, MLCommons val has {per} each"]
    elif plan.source_kind != "encoded" and max(counts) - min(counts) > 1:
        # (encoded data: an image that could not be decoded leaves its timestep one sample short)
        return [f"{where}: samples per timestep {counts} are not balanced"]
    return []


def _root_problems(output: Path, plan: ConversionPlan) -> list[str]:
    problems = []
    info = output / NV_META / ".info.json"
    if not (output / NV_META / "dataset.yaml").is_file() or not info.is_file():
        problems.append(f"{output / NV_META}: not indexed for Energon (run the index stage)")
    else:
        try:
            counts = json.loads(info.read_text()).get("shard_counts", {})
        except (ValueError, AttributeError, RecursionError) as exc:
            counts = {}
            problems.append(f"{info}: unreadable ({exc.__class__.__name__}); run the index stage again")
        for split, shard in plan.work():
            name = f"{split}/{shard_name(shard)}"
            if counts.get(name) != plan.shard_samples(split, shard):
                problems.append(
                    f"{info}: {name} has {counts.get(name)} samples, "
                    f"expected {plan.shard_samples(split, shard)}"
                )
    dims = DIMS[plan.dims] if plan.dims else None
    for name in EMPTY_FILES:
        path = output / EMPTY_DIR / name
        try:
            value = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            problems.append(f"{path}: missing or unreadable ({exc.__class__.__name__})")
            continue
        if value.dtype != np.float16:
            problems.append(f"{path}: dtype {value.dtype}, expected float16")
        if dims is not None:
            shape = dims.shapes()["t5_encodings" if name.startswith("t5") else "clip_encodings"]
            if value.shape != (1, *shape):
                problems.append(f"{path}: shape {list(value.shape)}, expected {[1, *shape]}")
    return problems


def _print_summary(
    console: Console, output: Path, plan: ConversionPlan, summaries: list[SplitSummary], problems: list[str]
) -> None:
    table = Table(title=f"verify {output} ({plan.source_kind}, shard size {plan.shard_size:,})")
    for column in ("split", "shards", "samples", "expected", "GB", "val timesteps", "status"):
        table.add_column(
            column,
            justify="left" if column in ("split", "status", "val timesteps") else "right",
            no_wrap=True,
        )
    for s in summaries:
        steps = " ".join(str(s.timesteps.get(t, 0)) for t in range(VAL_TIMESTEPS)) if s.split == "val" else ""
        status = "[green]ok[/green]" if s.ok else "[red]FAILED[/red]"
        table.add_row(
            s.split,
            str(s.shards),
            f"{s.samples:,}",
            f"{s.expected:,}",
            f"{s.nbytes / 1e9:.3f}",
            steps,
            status,
        )
    print_table(console, table)
    for problem in problems[:MAX_SHOWN]:
        console.print(f"[red]problem[/red] {problem}", highlight=False, soft_wrap=True)
    if len(problems) > MAX_SHOWN:
        console.print(f"... and {len(problems) - MAX_SHOWN} more problems")
    verdict = (
        "[green]verify: all checks passed[/green]"
        if not problems
        else f"[red]verify: {len(problems)} problem(s)[/red]"
    )
    console.print(verdict)
