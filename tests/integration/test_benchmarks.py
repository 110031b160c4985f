"""The benchmarks' own code paths on CPU (benchmarks/: the GPU work checked small)."""

from pathlib import Path


def test_the_throughput_benchmark_runs_on_cpu(tmp_path: Path) -> None:
    """benchmarks/train_throughput.py is GPU work; --smoke checks its code paths on CPU (the job's own,
    "ours", the same with train.precision fp8, and the plain diffusers + autocast "peer"), and
    --memory-estimate prints its full-depth table
    (meta device, no GPU)."""
    import json
    import subprocess
    import sys

    script = [sys.executable, str(Path(__file__).parents[2] / "benchmarks" / "train_throughput.py")]
    out = tmp_path / "throughput.json"

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([*script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # Both at once: the smoke runs on one thread, so the estimate's imports take the other core.
    smoke = start("--smoke", "--json", str(out), "--markdown", str(tmp_path / "throughput.md"))
    options = ["--world-sizes", "8,64", "--batches", "16", "--checkpointing", "full,none"]
    estimating = start("--memory-estimate", *options)
    try:
        outputs = [process.communicate(timeout=300) for process in (smoke, estimating)]
        result, estimate = (
            subprocess.CompletedProcess(p.args, p.returncode, *output)
            for p, output in zip((smoke, estimating), outputs, strict=True)
        )
    finally:  # a timeout leaves nothing running
        for process in (smoke, estimating):
            process.kill()
    assert result.returncode == 0, result.stderr[-2000:]
    facts = json.loads(out.read_text())
    rows = facts["rows"]
    cases = sorted((r["impl"], r["micro_batch"], r["checkpointing"], r["compile"]) for r in rows)
    assert cases == sorted(
        (impl, mbs, mode, False)
        for impl in ("ours", "ours-fp8", "peer")
        for mbs in (2,)
        for mode in ("full", "none")
    )
    phases = ("data_ms", "forward_ms", "backward_ms", "clip_ms", "optimizer_ms")
    for row in rows:
        assert row["status"] == "ok" and row["samples_per_s"] > 0 and row["peak_gb"] is None  # no GPU
        assert all(row[phase] > 0 for phase in phases), row
        assert (row["estimate_gb"] is not None) == (row["impl"] != "peer")
        # host-bound guards: the gap to the phases' sum, operators per step, no compiles while timed
        assert row["ops_per_step"] > 100 and row["host_gap_pct"] is not None and row["recompiles"] == 0
    # The console table has a row per case, and the ratios of every setting both ran: ours and ours-fp8
    # over the peer, ours-fp8 over ours; and ours' other modes over the peer's full checkpointing.
    cases_table, ratio_table = result.stdout.split("Ratios of samples/s")
    table = [line.split("│")[1].strip() for line in cases_table.splitlines() if line.startswith("│ ")]
    assert table.count("ours") == table.count("ours-fp8/tensorwise") == table.count("peer") == 2
    assert len(facts["ratios"]) == 8
    speed = {(r["label"], r["micro_batch"], r["checkpointing"]): r["samples_per_s"] for r in rows}
    for ratio in facts["ratios"]:
        ours = speed[(ratio["impl"], ratio["micro_batch"], ratio["checkpointing"])]
        other = speed[(ratio["over"], ratio["micro_batch"], ratio["over_checkpointing"])]
        assert ratio["ratio"] == ours / other
        assert f"{ours / other:.2f}x" in ratio_table
    over_full = [
        (r["impl"], r["checkpointing"]) for r in facts["ratios"] if r["over_checkpointing"] == "full"
    ]
    assert sorted(over_full) == [
        ("ours", "full"),
        ("ours", "none"),
        ("ours-fp8/tensorwise", "full"),
        ("ours-fp8/tensorwise", "full"),
        ("ours-fp8/tensorwise", "none"),
    ]
    assert "| ours | 2 | full | off |" in (tmp_path / "throughput.md").read_text()
    assert "| ours-fp8/tensorwise | 2 | full | off |" in (tmp_path / "throughput.md").read_text()

    assert estimate.returncode == 0, estimate.stderr[-2000:]
    table_rows = [line.split("│")[1:-1] for line in estimate.stdout.splitlines() if line.startswith("│ ")]
    cells = {(row[0].strip(), row[2].strip()): [cell.strip() for cell in row[3:]] for row in table_rows}
    assert list(cells) == [("8", "full"), ("8", "none"), ("64", "full"), ("64", "none")]
    total = {key: float(values[3]) for key, values in cells.items()}  # weights, gathered, activations, total
    assert total[("64", "full")] < total[("8", "full")] < total[("8", "none")]
    # fits 80 GB, and checkpointing 'auto' takes the least recompute under 90% of it (72 GB)
    assert cells[("8", "full")][-2] == cells[("8", "none")][-2] == "yes" and 67 < total[("8", "none")] < 72
    assert cells[("8", "none")][-1] == "<- auto" and cells[("8", "full")][-1] == ""


def test_torchtitans_flux_trains_beside_ours_on_cpu(tmp_path: Path) -> None:
    """The torchtitan case (benchmarks/throughput/titan.py, GPU work) on the tiny preset: torchtitan's own
    FLUX, its full checkpointing (more operators per step than without: the recomputed forward) and its
    float8 converter (the profiled step runs fp8 GEMMs; its bf16 case none), beside ours in one run;
    the goals table (ours over torchtitan's best, fp8 over bf16) and each case's grouped profile."""
    import json
    import subprocess
    import sys

    script = [sys.executable, str(Path(__file__).parents[2] / "benchmarks" / "train_throughput.py")]
    out, profiles, compiled = tmp_path / "bench.json", tmp_path / "profiles", tmp_path / "compiled.json"
    cases = "torchtitan:full,torchtitan:none,torchtitan-fp8:full,ours:full,ours-fp8:full"
    args = ["--smoke", "--cases", cases, "--profile", str(profiles), "--json", str(out)]
    # both at once (the smoke runs on one thread): its GPU setting too, each block compiled after its
    # checkpoint_wrapper with fullgraph=True
    runs = [
        subprocess.Popen([*script, *a], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for a in (
            [*args, "--markdown", str(tmp_path / "bench.md")],
            ["--smoke", "--cases", "torchtitan:full", "--compile", "on", "--json", str(compiled)],
        )
    ]
    try:
        outputs = [run.communicate(timeout=400) for run in runs]
    finally:  # a timeout leaves nothing running
        for run in runs:
            run.kill()
    assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in outputs]
    facts = json.loads(out.read_text())
    rows = {(r["label"], r["checkpointing"]): r for r in facts["rows"]}
    assert all(r["status"] == "ok" and r["samples_per_s"] > 0 for r in rows.values()), facts["rows"]
    titan, titan_none = rows[("torchtitan", "full")], rows[("torchtitan", "none")]
    assert titan["ops_per_step"] > titan_none["ops_per_step"]  # checkpoint_wrapper recomputes each block
    on = json.loads(compiled.read_text())["rows"][0]
    assert on["status"] == "ok" and on["compile"] and on["recompiles"] == 0
    assert on["ops_per_step"] < titan["ops_per_step"] / 2  # the blocks run as compiled graphs
    assert rows[("torchtitan-fp8/tensorwise", "full")]["time_groups"]["fp8 GEMM"] > 0
    assert titan["time_groups"]["fp8 GEMM"] == 0 and titan["time_groups"]["bf16 GEMM"] > 0
    assert len(list(profiles.glob("*.txt"))) == len(rows)
    goals = {g["goal"]: g for g in facts["goals"]}
    best_titan = max(titan["samples_per_s"], titan_none["samples_per_s"])
    ours = rows[("ours", "full")]["samples_per_s"]
    assert goals["ours bf16 / torchtitan's best bf16"]["measured"] == ours / best_titan
    fp8 = rows[("ours-fp8/tensorwise", "full")]["samples_per_s"]
    assert goals["fp8 tensorwise / bf16, full"]["measured"] == fp8 / ours
    over_peer_or_titan = {(r["impl"], r["over"]) for r in facts["ratios"]}
    assert {("ours", "torchtitan"), ("torchtitan-fp8/tensorwise", "torchtitan")} <= over_peer_or_titan
    markdown = (tmp_path / "bench.md").read_text()
    assert "Goals (issue 41):" in markdown and "| torchtitan | 2 | full |" in markdown
