"""Two groups, or two sets of groups, side by side with B/A ratios.

One group on each side: they are compared. Otherwise groups pair up by system and benchmark when
those are unique on both sides, else by their path below the side's root; a group with no partner
is listed as unmatched.
"""

from pathlib import Path
from typing import Any

from flux_cluster.report.scoring import GroupResult

COMPARED = [
    ("olympic minutes", "olympic_minutes"),
    ("mean minutes", "mean_minutes"),
    ("samples to converge", "samples_to_converge"),
    ("accelerators", "accelerators"),
    ("samples/s", "throughput_samples_per_s"),
    ("samples/s per accelerator", "throughput_per_accelerator"),
    ("MFU", "mfu"),
    ("GPU-hours", "gpu_hours"),
    ("cost USD", "cost_usd"),
    ("inference p50 s", "inference_p50_s"),
    ("inference p99 s", "inference_p99_s"),
    ("inference images/s", "inference_images_per_s"),
    ("inference USD per 1k images", "inference_usd_per_1k_images"),
    ("CLIP score base", "clip_score_base"),
    ("CLIP score tuned", "clip_score_tuned"),
]


def _system_key(group: GroupResult) -> str:
    return f"{group.system}/{group.benchmark}"


def _path_key(group: GroupResult, root: Path) -> str:
    try:
        return str(Path(group.path).relative_to(root.absolute()))
    except ValueError:
        return group.path


def _name(group: GroupResult) -> str:
    return f"{group.system or Path(group.path).name} ({group.benchmark}, {group.accelerators or '?'} acc)"


def compare(a_root: Path, a: list[GroupResult], b_root: Path, b: list[GroupResult]) -> dict[str, Any]:
    pairs: list[tuple[GroupResult, GroupResult]] = []
    unmatched: list[str] = []
    if len(a) == 1 and len(b) == 1:
        pairs.append((a[0], b[0]))
    else:
        a_keys, b_keys = [_system_key(g) for g in a], [_system_key(g) for g in b]
        if len(set(a_keys)) < len(a) or len(set(b_keys)) < len(b) or any(g.system is None for g in a + b):
            a_keys, b_keys = [_path_key(g, a_root) for g in a], [_path_key(g, b_root) for g in b]
        b_by_key = dict(zip(b_keys, b, strict=True))
        for key, group in zip(a_keys, a, strict=True):
            partner = b_by_key.pop(key, None)
            if partner is None:
                unmatched.append(f"A {group.path}")
            else:
                pairs.append((group, partner))
        unmatched += [f"B {g.path}" for g in b_by_key.values()]
    return {
        "a": str(a_root),
        "b": str(b_root),
        "pairs": [_pair(x, y) for x, y in pairs],
        "unmatched": unmatched,
    }


def _pair(a: GroupResult, b: GroupResult) -> dict[str, Any]:
    metrics = []
    for name, attribute in COMPARED:
        x, y = getattr(a, attribute), getattr(b, attribute)
        ratio = y / x if isinstance(x, int | float) and isinstance(y, int | float) and x else None
        metrics.append({"name": name, "key": attribute, "a": x, "b": y, "ratio": ratio})
    return {"a_path": a.path, "b_path": b.path, "a_name": _name(a), "b_name": _name(b), "metrics": metrics}
