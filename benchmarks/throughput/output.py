"""The output of benchmarks/train_throughput.py: a rich table on the console, a markdown table, JSON;
the ratios of samples/s; the memory-estimate table."""

import argparse
import json
import math
from dataclasses import asdict

from rich.console import Console
from rich.table import Table

from flux_cluster.config.workload import ModelArgs, load_workload
from flux_cluster.training.batch_choice import choose_micro_batch
from flux_cluster.training.memory import AUTO_HEADROOM, choose_checkpointing, estimate_memory
from throughput.cases import PHASES, Row
from throughput.goals import GOAL_COLUMNS, GROUP_COLUMNS, goal_cells, goals, group_cells


def ratios(rows: list[Row]) -> list[dict[str, object]]:
    """ours/peer and ours-fp8/peer samples/s for each (micro-batch, checkpointing, compile) both ran,
    ours-fp8 over ours (bf16) where both ran, and the quantized LoRA bases over the bf16 one; and every
    other mode of ours over the peer's full checkpointing (issue 26's goal: 1.25x at +5% peak memory).
    The same over torchtitan's FLUX (ours and ours-fp8 over it; it and its fp8 over the peer; its fp8 over
    it)."""
    ok = {(r.label, r.micro_batch, r.checkpointing, r.compile): r for r in rows if r.status == "ok"}
    out = []
    for (label, mbs, mode, compiled), ours in ok.items():
        if label == "peer":
            continue
        bases = [("peer", mode), ("ours", mode), ("lora-bf16", mode)]
        if label.startswith("torchtitan"):  # over the peer, and its fp8 over its bf16
            bases = [("peer", mode), ("torchtitan", mode)]
        elif not label.startswith("lora"):  # ours (and ours-fp8) over torchtitan's own FLUX too
            bases.append(("torchtitan", mode))
        if mode != "full" and not label.startswith("lora"):
            bases += [("peer", "full"), ("torchtitan", "full")]
        for base, base_mode in bases:
            other = ok.get((base, mbs, base_mode, compiled))
            if other is None or base == label:
                continue
            out.append(
                {
                    "impl": label,
                    "over": base,
                    "over_checkpointing": base_mode,
                    "micro_batch": mbs,
                    "checkpointing": mode,
                    "compile": compiled,
                    "samples_per_s": ours.samples_per_s,
                    "other_samples_per_s": other.samples_per_s,
                    "ratio": ours.samples_per_s / other.samples_per_s,
                    "peak_ratio": ours.peak_gb / other.peak_gb,
                }
            )
    return out


def _num(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


COLUMNS = (
    ("impl", lambda r: r.label),
    ("mbs", lambda r: str(r.micro_batch)),
    ("act-ckpt", lambda r: r.checkpointing),
    ("compile", lambda r: "on" if r.compile else "off"),
    ("step ms", lambda r: _num(r.step_ms, ".1f")),
    ("samples/s", lambda r: _num(r.samples_per_s, ".2f")),
    ("TFLOP/s", lambda r: _num(r.tflops, ".1f")),
    ("MFU", lambda r: _num(r.mfu_datasheet, ".1%")),
    ("MFU meas.", lambda r: _num(r.mfu_measured, ".1%")),
    ("peak GB", lambda r: _num(r.peak_gb, ".1f")),
    ("est. GB", lambda r: _num(r.estimate_gb, ".1f")),
    *((f"{p} ms", lambda r, p=p: _num(getattr(r, f"{p}_ms"), ".1f")) for p in PHASES),
    ("host gap", lambda r: _num(r.host_gap_pct, ".1f") + ("%" if not math.isnan(r.host_gap_pct) else "")),
    ("ops/step", lambda r: _num(r.ops_per_step, ".0f")),
    ("kernels/step", lambda r: _num(r.kernels_per_step, ".0f")),
    ("host ms (max)", lambda r: f"{_num(r.host_median_ms, '.1f')} ({_num(r.host_max_ms, '.0f')})"),
    ("gc ms (full)", lambda r: f"{_num(r.gc_ms, '.1f')} ({_num(r.full_gcs, '.0f')})"),
    ("recompiles", lambda r: _num(r.recompiles, ".0f")),
    ("note", lambda r: "" if r.status == "ok" else r.status),
)

RATIO_COLUMNS = (
    "impl",
    "over",
    "mbs",
    "act-ckpt",
    "compile",
    "samples/s",
    "its samples/s",
    "ratio",
    "peak GB ratio",
)


def ratio_cells(ratio: dict) -> list[str]:
    over = ratio["over_checkpointing"]
    return [
        ratio["impl"],
        ratio["over"] + ("" if over == ratio["checkpointing"] else f" {over}"),
        str(ratio["micro_batch"]),
        ratio["checkpointing"],
        "on" if ratio["compile"] else "off",
        f"{ratio['samples_per_s']:.2f}",
        f"{ratio['other_samples_per_s']:.2f}",
        f"{ratio['ratio']:.2f}x",
        _num(ratio["peak_ratio"], ".3f"),
    ]


def rich_table(title: str, headers: list[str] | tuple[str, ...], rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for header in headers:
        table.add_column(header, justify="left" if header in ("impl", "note") else "right")
    for cells in rows:
        table.add_row(*cells)
    return table


def markdown_table(headers: list[str] | tuple[str, ...], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(cells) + " |" for cells in rows)])


def memory_table(
    args: ModelArgs, worlds: list[int], batches: list[int], modes: list[str], gpu_gb: float
) -> tuple[list[str], list[list[str]]]:
    headers = ["world", "mbs", "act-ckpt", "weights+optim GB", "gathered GB", "activations GB", "total GB"]
    rows = []
    for world in worlds:
        for micro_batch in batches:
            picked = choose_checkpointing(args, world, micro_batch, gpu_gb).mode
            # auto's choice gets a row of its own where it is none of the modes asked for (an ops+N)
            for mode in [*modes, *([picked] if picked not in modes else [])]:
                e = estimate_memory(args, world, micro_batch, mode)
                parts = (e.weights_and_optimizer_gb, e.gathered_params_gb, e.activations_gb, e.total_gb)
                fits = "yes" if e.total_gb <= gpu_gb else "no"
                auto = picked == mode
                rows.append(
                    [str(world), str(micro_batch), mode, *(f"{p:.1f}" for p in parts), fits, auto * "<- auto"]
                )
    return [*headers, f"fits {gpu_gb:g} GB", "auto picks"], rows


BRIEF = ("impl", "mbs", "act-ckpt", "compile", "step ms", "samples/s", "MFU", "peak GB", "host gap")
BRIEF += ("ops/step", "kernels/step", "host ms (max)", "gc ms (full)", "recompiles")
"""The columns of the line printed as each case finishes."""


def tables(rows: list[Row]) -> tuple[list[str], list[list[str]], list[list[str]]]:
    headers = [h for h, _ in COLUMNS]
    cells = [[cell(r) for _, cell in COLUMNS] for r in rows]
    return headers, cells, [ratio_cells(r) for r in ratios(rows)]


def goal_tables(rows: list[Row]) -> list[tuple[str, tuple[str, ...], list[list[str]]]]:
    """(title, headers, rows) of the goals these rows answer and of where profiled steps' time goes;
    tables without rows are left out."""
    found = [
        ("Goals (issue 41)", GOAL_COLUMNS, [goal_cells(g) for g in goals(rows)]),
        ("Where a profiled step's time goes (share of its kernels' device time; CPU: operators' own time)",
         GROUP_COLUMNS, group_cells(rows)),
    ]  # fmt: skip
    return [table for table in found if table[2]]


def write_outputs(args: argparse.Namespace, header: str, facts: dict, rows: list[Row]) -> None:
    headers, cells, ratio_rows = tables(rows)
    if args.markdown:
        tables_md = f"{markdown_table(headers, cells)}\n\n{markdown_table(RATIO_COLUMNS, ratio_rows)}"
        for title, goal_headers, goal_rows in goal_tables(rows):
            tables_md += f"\n\n{title}:\n\n{markdown_table(goal_headers, goal_rows)}"
        args.markdown.write_text(f"{header}\n\n{tables_md}\n")
    if args.json:
        rows_facts = {"rows": [asdict(r) | {"label": r.label} for r in rows], "ratios": ratios(rows)}
        rows_facts["goals"] = goals(rows)
        args.json.write_text(json.dumps(_nan_to_null(facts | rows_facts), indent=1) + "\n")


def _nan_to_null(value: object) -> object:
    """Strict JSON: a value a case lacks (a failed case, memory on the CPU) is null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_null(v) for v in value]
    return value


def print_memory_estimate(args: argparse.Namespace, console: Console) -> None:
    workload = load_workload("flux1")[0]
    full_depth = workload.models["flux-schnell"]
    headers, rows = memory_table(full_depth, args.world_sizes, args.batches, args.checkpointing, args.gpu_gb)
    title = (
        "Memory per GPU, estimated: flux-schnell (19+38 blocks), FSDP over 'world' ranks, bf16, compiled; "
        "total = peak (activations count where they exceed the gradients the backward brings); "
        f"'auto' takes the least recompute under {1 - AUTO_HEADROOM:.0%} of --gpu-gb"
    )
    console.print(rich_table(title, headers, rows))
    assert workload.mlperf is not None
    gbs = workload.mlperf.global_batch_size
    for world in (w for w in args.world_sizes if gbs % w == 0):  # train.micro_batch_size 'auto'
        choice = choose_micro_batch(full_depth, world, gbs // world, "auto", args.gpu_gb)
        line = f"world {world}, global batch {gbs}: {choice.describe()}"
        console.print(line, markup=False, highlight=False)
