"""The precision ladder: LoRA runs that differ in ``train.base_precision`` (bf16, fp8, nf4) side by side,
as seed 004's table (precision | train VRAM | inference VRAM | speed | quality), measured, not claimed.

One row per run folder (its repeats together, as the report's fine-tuning table): train memory is the
run's peak (every rank's, every attempt's: CUDA's max_memory_allocated on GPUs, the process's peak RSS on
CPUs) and the weight memory of one rank once sharded (a quantized base held whole: where the base's
precision shows directly);
inference memory is the peak of its ``flux-cluster evaluate`` results (measured on GPUs only; an evaluate
run on a CPU records none); speed the training images/s over the measured steps; quality the final
validation loss and the CLIP score of the fine-tuned model's images against their prompts (evaluate).
Rows measured on CPUs are marked: their figures say nothing of a GPU.
"""

import statistics
from dataclasses import dataclass, field, fields
from typing import Any

from flux_cluster.report.scoring import GroupResult

ORDER = ("bf16", "fp8", "nf4")
LADDER_TITLE = "Precision ladder: LoRA on a bf16, fp8 or nf4 frozen base"
LADDER_NOTE = (
    "LoRA runs whose train.base_precision differs, side by side: train memory (peak; params: one rank's "
    "weights once sharded, a quantized base whole), inference memory (peak of flux-cluster evaluate on a "
    "GPU), training images/s, final validation loss and CLIP score (evaluate). Rows on a CPU (meaningful: "
    "no) are meaningless for GPUs: their memory is the process's peak RSS and their speed the CPU's"
)


@dataclass(frozen=True)
class LadderRow:
    """One run folder's rung. Field names are the report's JSON schema: keep stable."""

    precision: str
    path: str
    device: str | None
    train_memory_gb: float | None
    parameter_gb: float | None
    inference_memory_gb: float | None
    images_per_s: float | None
    final_eval_loss: float | None
    clip_score: float | None
    meaningful: bool
    """False for a run on a CPU: its figures are meaningless for GPUs."""
    group: GroupResult = field(repr=False, compare=False)
    """The run folder's group (not in the JSON: the report's groups are)."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "group"}


def _precision(group: GroupResult) -> str | None:
    found = {run.fine_tuning.base_precision for run in group.runs if run.fine_tuning}
    found.discard(None)
    return found.pop() if len(found) == 1 else None  # type: ignore[return-value]


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _on_cpu(group: GroupResult) -> bool:
    devices = {e.device.lower() for e in group.evals if e.device}
    return (group.accelerator_model or "").lower() == "cpu" or any("cpu" in d for d in devices)


def ladder_rows(groups: list[GroupResult]) -> list[LadderRow]:
    """The ladder's rows, bf16 to nf4; none unless the LoRA runs span two precisions or more."""
    rows = []
    for group in groups:
        precision = _precision(group) if group.train_mode == "lora" else None
        if precision is None:
            continue
        tuned = [e.tuned for e in group.evals if e.tuned is not None]
        params = [r.fine_tuning.parameter_gb for r in group.runs if r.fine_tuning]
        rows.append(
            LadderRow(
                precision=precision,
                path=group.path,
                device=group.accelerator_model,
                train_memory_gb=group.peak_memory_gb,
                parameter_gb=max((p for p in params if p is not None), default=None),
                inference_memory_gb=max((t.peak_memory_gb for t in tuned if t.peak_memory_gb), default=None),
                images_per_s=group.images_per_s,
                final_eval_loss=group.final_eval_loss,
                clip_score=_mean([e.clip_tuned for e in group.evals]),
                meaningful=not _on_cpu(group),
                group=group,
            )
        )
    if len({row.precision for row in rows}) < 2:
        return []
    rank = {name: index for index, name in enumerate(ORDER)}
    return sorted(rows, key=lambda r: (rank.get(r.precision, len(ORDER)), r.precision, r.path))


def ladder_document(groups: list[GroupResult]) -> dict[str, Any] | None:
    """The ladder for the JSON report (None without one)."""
    rows = ladder_rows(groups)
    return {"note": LADDER_NOTE, "rows": [row.to_json() for row in rows]} if rows else None
