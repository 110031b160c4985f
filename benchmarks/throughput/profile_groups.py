"""Where one profiled training step's time goes, grouped: fp8 GEMMs, bf16 GEMMs, attention, amax
reductions, casts and scaling, the optimizer, the rest. On a GPU: each kernel's device time, grouped by
the operator that launched it (aten::_scaled_mm's kernels are fp8 GEMMs, aten::mm/addmm/bmm's bf16 ones)
and otherwise by the kernel's name (compiled blocks launch Triton kernels named after what they fuse:
``..._amax_...``, ``..._to_copy_clamp_...``). On the CPU: each operator's own CPU time, by its name.
"""

import re
from collections import defaultdict
from collections.abc import Iterable

GROUPS = ("fp8 GEMM", "bf16 GEMM", "attention", "amax", "casts & scaling", "optimizer", "other")
"""In the order they print. bf16 GEMM: every GEMM not in fp8 (float32 ones too, e.g. the peer's)."""

_FP8_GEMM_OPS = frozenset({"aten::_scaled_mm", "aten::_scaled_grouped_mm"})
_GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"})
_BY_NAME = (  # first match wins: attention before GEMMs (fmha_cutlass...), GEMMs before casts (e4m3)
    ("fp8 GEMM", re.compile(r"e4m3|e5m2|f8f8|_scaled_mm")),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|scaled_dot_product")),
    ("bf16 GEMM", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|aten::(mm|addmm|bmm|baddbmm)$")),
    ("amax", re.compile(r"amax|aten::abs$|aten::max$")),
    ("optimizer", re.compile(r"adam|multi_tensor|_foreach")),
    ("casts & scaling", re.compile(r"to_copy|copy_|clamp|float8|reciprocal|convert|cast")),
)


def group_of(op: str, kernel: str = "") -> str:
    """The group of a kernel (``kernel``) launched by operator ``op``, or of the operator alone (CPU)."""
    if op in _FP8_GEMM_OPS:
        return "fp8 GEMM"
    if op in _GEMM_OPS:
        return "bf16 GEMM"
    name = (kernel or op).lower()
    return next((group for group, pattern in _BY_NAME if pattern.search(name)), "other")


def time_groups(events: Iterable[object], cuda: bool, top: int = 20) -> tuple[dict[str, float], list[tuple]]:
    """Milliseconds per group over a profiled step's events (torch.profiler's ``prof.events()``), and the
    ``top`` kernels (GPU) or operators (CPU) by time as (group, name, calls, ms), largest first."""
    per_name: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    device_ms = 0.0  # every kernel's time, linked to an operator or not
    for event in events:
        if event.device_type.name != "CPU":
            device_ms += event.time_range.elapsed_us() / 1e3
            continue  # counted by name through the operator that launched it
        if cuda:
            for kernel in event.kernels:
                entry = per_name[(group_of(event.name, kernel.name), kernel.name)]
                entry[0] += 1
                entry[1] += kernel.duration / 1e3
        elif event.self_cpu_time_total > 0:
            entry = per_name[(group_of(event.name), event.name)]
            entry[0] += 1
            entry[1] += event.self_cpu_time_total / 1e3
    groups = dict.fromkeys(GROUPS, 0.0)
    for (group, _), (_, ms) in per_name.items():
        groups[group] += ms
    groups["other"] += max(0.0, device_ms - sum(groups.values())) if cuda else 0.0  # not linked to an op
    ranked = sorted(per_name.items(), key=lambda item: -item[1][1])[:top]
    return groups, [(group, name, int(calls), ms) for (group, name), (calls, ms) in ranked]


def groups_text(groups: dict[str, float], ranked: list[tuple], cuda: bool) -> str:
    """The groups with their share, then the top kernels or operators, as plain text."""
    total = sum(groups.values()) or 1.0
    what = "GPU kernels by device time" if cuda else "operators by their own CPU time"
    lines = [f"one step's {what}, grouped: {total:.2f} ms"]
    lines += [f"  {group:<16} {ms:10.2f} ms  {ms / total:6.1%}" for group, ms in groups.items()]
    lines.append(f"top {len(ranked)}:")
    lines += [f"  {ms:10.2f} ms  {calls:5d}x  {group:<16} {name[:140]}" for group, name, calls, ms in ranked]
    return "\n".join(lines) + "\n"
