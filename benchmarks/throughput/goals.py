"""Issue 41's goals, read off one run's rows: ours over torchtitan's best bf16 at no more than its peak
memory, fp8 over bf16 at equal checkpointing (per recipe), the best MFU; and where each profiled case's
step time goes (profile_groups.py)."""

import math

from throughput.cases import Row
from throughput.profile_groups import GROUPS

OVER_TORCHTITAN = 1.15
FP8_OVER_BF16 = 1.25
BEST_MFU = 0.60

GOAL_COLUMNS = ("goal", "measured", "target", "met", "what")
GROUP_COLUMNS = ("impl", "mbs", "act-ckpt", "step ms", *GROUPS)


def _case(row: Row) -> str:
    peak = "" if math.isnan(row.peak_gb) else f", {row.peak_gb:.1f} GB"
    return f"{row.label} {row.checkpointing} mbs {row.micro_batch}: {row.samples_per_s:.2f} samples/s{peak}"


def _goal(name: str, measured: float, target: float, what: str, met: bool | None = None) -> dict[str, object]:
    met = measured >= target if met is None else met
    return {"goal": name, "measured": measured, "target": target, "met": met, "what": what}


def goals(rows: list[Row]) -> list[dict[str, object]]:
    """One entry per goal these rows can answer (a goal whose cases did not run is left out)."""
    ok = [r for r in rows if r.status == "ok"]
    out = []
    titan = [r for r in ok if r.label == "torchtitan"]
    ours = [r for r in ok if r.label == "ours"]
    if titan and ours:
        best_titan = max(titan, key=lambda r: r.samples_per_s)
        # peaks are nan on the CPU: no memory to compare, every case counts as fitting
        fitting = [r for r in ours if not r.peak_gb > best_titan.peak_gb] or ours
        best = max(fitting, key=lambda r: r.samples_per_s)
        fits = not best.peak_gb > best_titan.peak_gb
        ratio = best.samples_per_s / best_titan.samples_per_s
        what = f"{_case(best)} over {_case(best_titan)}" + ("" if fits else " (over its peak memory)")
        met = ratio >= OVER_TORCHTITAN and fits
        out.append(_goal("ours bf16 / torchtitan's best bf16", ratio, OVER_TORCHTITAN, what, met))
    bf16 = {(r.micro_batch, r.checkpointing, r.compile): r for r in ours}
    for fp8 in (r for r in ok if r.impl == "ours-fp8"):
        base = bf16.get((fp8.micro_batch, fp8.checkpointing, fp8.compile))
        if base is not None:
            ratio = fp8.samples_per_s / base.samples_per_s
            name = f"fp8 {fp8.fp8_recipe} / bf16, {fp8.checkpointing}"
            out.append(_goal(name, ratio, FP8_OVER_BF16, f"{_case(fp8)} over {_case(base)}"))
    if ok:
        best = max(ok, key=lambda r: r.mfu_datasheet)
        out.append(_goal("best MFU (datasheet peak)", best.mfu_datasheet, BEST_MFU, _case(best)))
    return out


def goal_cells(goal: dict[str, object]) -> list[str]:
    measured, target = float(goal["measured"]), float(goal["target"])
    percent = str(goal["goal"]).startswith("best MFU")
    spec = ".1%" if percent else ".2f"
    suffix = "" if percent else "x"
    return [
        str(goal["goal"]),
        f"{measured:{spec}}{suffix}",
        f">= {target:{spec}}{suffix}",
        "yes" if goal["met"] else "NO",
        str(goal["what"]),
    ]


def group_cells(rows: list[Row]) -> list[list[str]]:
    """Profiled cases: the step's ms and each group's share of the profiled time."""
    out = []
    for r in rows:
        total = sum(r.time_groups.values())
        if r.status != "ok" or not total:
            continue
        shares = [f"{r.time_groups.get(g, 0.0) / total:.1%}" for g in GROUPS]
        out.append([r.label, str(r.micro_batch), r.checkpointing, f"{r.step_ms:.1f}", *shares])
    return out
