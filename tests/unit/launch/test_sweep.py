"""Sweeps and the Python API: a grid of throughput runs on --system local (synthetic batches, an injected
out-of-memory point), resume, the same answers from the CLI and the API, and a sweep through real Slurm."""

import csv
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from flux_cluster import api
from flux_cluster.cli import app
from flux_cluster.errors import FluxClusterError
from flux_cluster.launch.sweep import create_sweep
from flux_cluster.launch.sweep_plan import ONE_STEP_NOTE, SweepRequest, parse_grid, plan_sweep, print_plan
from flux_cluster.sweepdir import SweepState


def test_grid_parsing_refuses_bad_items() -> None:
    assert parse_grid(["train.micro_batch_size=4, 8", "nodes=1"]) == {
        "train.micro_batch_size": ["4", "8"],
        "nodes": ["1"],
    }
    for bad, why in (
        (["train.micro_batch_size"], "expected KEY=VALUE1"),
        (["train.compile=true,"], "expected KEY=VALUE1"),
        (["a b=1"], "expected KEY=VALUE1"),
        (["nodes=1", "nodes=2"], "given twice"),
        (["nodes=1,1"], "listed twice"),
        ([], "no --grid"),
    ):
        with pytest.raises(FluxClusterError, match=why):
            parse_grid(bad)


def test_a_bad_point_is_refused_before_anything_runs(workdir: Path) -> None:
    """A train sweep keeps the system's global batch (16 on local): a micro-batch of 3 does not divide it.
    (A throughput sweep sizes each point's batch from its micro-batch instead.)"""
    request = SweepRequest("local", {"train.micro_batch_size": ["8", "3"]}, job="train")
    with pytest.raises(FluxClusterError, match=r"sweep point 1 \(micro_batch_size=3\).*not a multiple"):
        create_sweep(request)
    assert not (workdir / "runs").exists()  # nothing written


def test_here_on_a_container_system_and_taken_names_are_refused_up_front(workdir: Path) -> None:
    here = SweepRequest("dgx_h100x8", {"train.micro_batch_size": ["4"]}, synthetic=True, here=True)
    with pytest.raises(FluxClusterError, match=r"sweep point 0 .*launcher 'local' runs on this machine"):
        create_sweep(here)
    (workdir / "runs" / "flux1").mkdir(parents=True)  # an ordinary job's runs are no sweep folder
    request = SweepRequest("local", {"train.micro_batch_size": ["8"]}, synthetic=True, name="flux1")
    with pytest.raises(FluxClusterError, match=r"runs/flux1: it exists, or choose another --name"):
        create_sweep(request)
    create_sweep(replace(request, name="twice"))
    with pytest.raises(FluxClusterError, match="a sweep of that name exists; --resume it"):
        create_sweep(replace(request, name="twice"))


def test_a_damaged_sweep_file_is_one_line(cli: CliRunner, workdir: Path) -> None:
    folder = workdir / "runs" / "bad"
    folder.mkdir(parents=True)
    document = {
        "name": "bad", "system": "local", "job": "throughput", "grid": {"nodes": ["1"]}, "overrides": [],
        "synthetic": True, "max_parallel": None, "here": False, "created_at": 0.0,
        "points": [{"index": 0, "values": ["nodes=1"]}],
    }  # fmt: skip
    (folder / "sweep.json").write_text(json.dumps(document))
    result = cli.invoke(app, ["sweep", "--resume", "bad"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.startswith(f"error: {folder / 'sweep.json'}: point 0: expected values (strings)")


def test_sweep_cli_refuses_input_in_one_line(cli: CliRunner, workdir: Path) -> None:
    for args, message in (
        (["sweep", "--grid", "train.micro_batch_size"], "expected KEY=VALUE1"),
        (["sweep", "--grid", "nodes=1", "--job", "preflight"], "a sweep runs throughput or train"),
        (["sweep", "--grid", "nodes=1", "--job", "train", "--synthetic"], "only the throughput job"),
        (["sweep", "--resume", "nothing-here"], "no sweep.json"),
        (["sweep", "--grid", "nodes=1", "--resume", "x"], "give no --grid"),
        (["sweep", "--resume", "x", "--set", "nodes=2", "--here"], "give no --set, --here (start a new"),
        (["sweep", "--resume", "x", "--steps", "20"], "give no --steps"),  # even the default value
        (["sweep", "--grid", "nodes=1", "--submit", "--here"], "--submit and --here: choose one"),
        (["sweep", "--grid", "nodes=1", "--submit"], "system local has no Slurm (launcher local)"),
        (["sweep", "--grid", "nodes=1", "--dependency", "afterok:1"], "the points run on this machine"),
        (
            ["sweep", "--system", "local_slurm", "--grid", "nodes=1", "--dependency", "afterok:x"],
            "expected TYPE:JOBID",
        ),
        (
            [
                "sweep",
                "--system",
                "local_slurm",
                "--grid",
                "nodes=1",
                "--job",
                "train",
                "--set",
                "mlperf.nexp=2",
            ],
            "are array tasks themselves; use --set mlperf.nexp_mode=serial",
        ),
        (["submit", "--job", "train", "--synthetic"], "only the throughput job takes it"),
    ):
        result = cli.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.startswith("error: ") and message in result.output, result.output
        assert "Traceback" not in result.output


def test_the_api_imports_no_torch() -> None:
    code = "import sys, flux_cluster.api; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_a_train_point_records_its_node_count(tmp_path: Path) -> None:
    """A train job's point takes its figures from its result log (here a real MLPerf v5.1 one, 4 nodes of
    4 GPUs) and its node count from the run's config, which the report's best-per-node-count uses."""
    import tarfile

    from flux_cluster.config import load_system
    from flux_cluster.launch.sweep_status import view
    from flux_cluster.rundir import RunRecord, write_run_config
    from flux_cluster.sweepdir import Point

    archive = Path(__file__).parents[2] / "data" / "mlperf_v51_sample.tar.xz"
    run_dir = tmp_path / "sweep" / "20260101-000000-p000"
    (run_dir / "results").mkdir(parents=True)
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/flux1/result_0.txt"))
        log = tar.extractfile(member)
        assert log is not None
        (run_dir / "results" / "result_0.txt").write_bytes(log.read())
    write_run_config(run_dir, load_system("gb200_nvl72", ["nodes=4"]).config, {"name": "train"})
    RunRecord(launcher="local", job_ids=[], submitted_at=0.0, exit_code=0).save(run_dir)  # it has ended
    point = Point(index=0, values={"train.micro_batch_size": "32"}, status="running", run_dir=str(run_dir))
    state = SweepState(
        name="sweep", system="gb200_nvl72", job="train", grid={"train.micro_batch_size": ["32"]},
        overrides=[], synthetic=False, max_parallel=None, here=False, created_at=0.0, points=[point],
    )  # fmt: skip
    state.save(tmp_path / "sweep")
    (seen,) = view(tmp_path / "sweep").points
    assert seen.status == "ok" and seen.result["nodes"] == 4, seen.result
    assert [row["nodes"] for row in api.open_sweep(tmp_path / "sweep").report().best] == [4]


def _finished_sweep(folder: Path, grid: dict[str, list[str]], speeds: dict[int, float | str]) -> SweepState:
    """A sweep folder as a finished sweep leaves it: speeds maps a point to samples/s, or to its status."""
    from itertools import product

    from flux_cluster.sweepdir import Point

    points = []
    for i, combo in enumerate(product(*grid.values())):
        values = dict(zip(grid, combo, strict=True))
        speed = speeds[i]
        point = Point(index=i, values=values, status="ok" if isinstance(speed, float) else speed)
        nodes = int(values.get("nodes", "1"))
        point.result = {"world_size": 8 * nodes, "nodes": nodes, "wall_s": 60.0, "peak_memory_gb": 40.0}
        if isinstance(speed, float):
            point.result |= {"samples_per_s": speed, "samples_per_s_per_gpu": speed / (8 * nodes)}
        else:
            point.error = f"{speed} at point {i}"
        points.append(point)
    state = SweepState(
        name=folder.name,
        system="dgx_h100x8",
        job="throughput",
        grid=grid,
        overrides=[],
        synthetic=True,
        max_parallel=None,
        here=False,
        created_at=0.0,
        points=points,
        price_per_gpu_hour=3.0,
    )
    folder.mkdir(parents=True)
    state.save(folder)
    return state


def test_the_sweep_report_sorts_finds_the_best_per_node_count_and_plots(
    cli: CliRunner, tmp_path: Path
) -> None:
    folder = tmp_path / "scaling"
    grid = {"train.micro_batch_size": ["4", "8", "16"], "nodes": ["1", "2"]}
    # point i: mbs 4/8/16 x nodes 1/2 in product order; mbs 16 on 1 node runs out of memory
    speeds: dict[int, float | str] = {0: 100.0, 1: 180.0, 2: 150.0, 3: 290.0, 4: "oom", 5: "failed"}
    _finished_sweep(folder, grid, speeds)
    report = api.report([folder]).sweeps[0]
    assert [r["point"] for r in report.rows] == [3, 1, 2, 0, 4, 5]  # ok by samples/s, then the others
    assert [(r["nodes"], r["point"]) for r in report.best] == [(1, 2), (2, 3)]  # never the oom/failed ones
    document = api.report([folder]).to_json()
    assert document["schema_version"] == 1 and document["sweeps"][0]["grid"] == grid
    assert document["sweeps"][0]["best"][1]["usd_per_million_samples"] == pytest.approx(
        3 * 16 / 3600 / 290 * 1e6
    )

    for fmt in ("json", "csv", "md", "html", "table"):
        result = cli.invoke(app, ["report", str(folder), "--format", fmt], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (fmt, result.output)
        if fmt == "json":
            assert json.loads(result.stdout) == document
        if fmt == "csv":
            rows = list(csv.DictReader(result.stdout.splitlines()))
            assert [r["point"] for r in rows] == ["3", "1", "2", "0", "4", "5"] and rows[4]["status"] == "oom"
        if fmt == "html":
            assert result.stdout.count("<svg") == 2  # throughput vs micro-batch, and scaling
            assert (
                "Throughput per GPU vs micro-batch size" in result.stdout
                and "oom at point 4" in result.stdout
            )
        if fmt in ("md", "table"):
            assert "best point per node count" in result.stdout.lower()
    written = tmp_path / "out" / "sweep.html"
    written.parent.mkdir()
    assert cli.invoke(app, ["report", str(folder), "-f", "html", "-o", str(written)]).exit_code == 0
    assert written.read_text().startswith("<!DOCTYPE html>")

    mixed = cli.invoke(app, ["report", str(folder), str(tmp_path)])
    assert mixed.exit_code == 2 and "report sweep folders on their own" in mixed.output


def test_a_sweep_without_varied_micro_batch_or_nodes_has_no_plots(cli: CliRunner, tmp_path: Path) -> None:
    folder = tmp_path / "compile"
    _finished_sweep(folder, {"train.compile": ["false", "true"]}, {0: 10.0, 1: 12.0})
    result = cli.invoke(app, ["report", str(folder), "--format", "html"])
    assert result.exit_code == 0 and "<svg" not in result.stdout and "compile" in result.stdout
    assert api.open_sweep(folder).best()["train.compile"] == "true"


def test_arrays_wait_only_as_far_as_max_parallel_needs() -> None:
    """Four arrays of 3 points under --max-parallel 8: two run side by side, each later one waits for the
    oldest still in the window; an array wider than the window (its own %N) waits for all before it;
    no window, no waiting."""
    from flux_cluster.launch.sweep_arrays import make_room

    in_slurm: list[tuple[str, int]] = []
    waits = []
    for array in ("a", "b", "c", "d"):
        waits.append(make_room(in_slurm, 3, 8))
        in_slurm.append((array, 3))
    assert waits == [[], [], ["a"], ["b"]] and in_slurm == [("c", 3), ("d", 3)]
    assert make_room(in_slurm, 8, 8) == ["c", "d"] and in_slurm == []
    assert make_room([("a", 5)], 5, None) == []


@pytest.mark.parametrize(
    ("numbers", "message"),
    [
        ({"max_parallel": 0}, "--max-parallel: got 0, expected at least 1"),
        ({"steps": 0}, "--steps: got 0, expected at least 1"),
        ({"warmup_steps": -1}, "--warmup-steps: got -1, expected at least 0"),
    ],
)
def test_the_api_refuses_bad_sweep_numbers_before_writing_anything(
    numbers: dict[str, int], message: str, workdir: Path
) -> None:
    with pytest.raises(FluxClusterError, match=message):
        api.sweep("local", {"train.micro_batch_size": [1]}, synthetic=True, name="numbers", **numbers)
    assert not (workdir / "runs").exists()


def test_a_throughput_sweep_scales_the_global_batch_per_point(workdir: Path) -> None:
    """The README's first sweep: 32 ranks x micro-batch 32 does not split a global batch of 512, and a
    throughput point needs none: each point trains one step's worth, and the plan says so."""
    grid = parse_grid(["train.micro_batch_size=4,32", "train.compile=false,true", "nodes=1,4"])
    request = SweepRequest("dgx_h100x8", grid, synthetic=True, submit=True, max_parallel=4)
    plan = plan_sweep(request)
    batches = {
        (p.values["train.micro_batch_size"], p.values["nodes"]): gbs
        for p, gbs in zip(plan.points, plan.global_batch, strict=True)
    }
    assert batches == {("4", "1"): 32, ("4", "4"): 128, ("32", "1"): 256, ("32", "4"): 1024}
    assert plan.points[-1].derived[0] == "train.global_batch_size=1024"
    console = Console(record=True, width=200)
    print_plan(plan, console)
    assert ONE_STEP_NOTE in console.export_text()
    assert not (workdir / "runs").exists()  # a plan writes nothing
    # a global batch given by --set or the grid is kept, and checked as before
    fixed = replace(request, overrides=["train.global_batch_size=512"])
    with pytest.raises(FluxClusterError, match=r"sweep point \d+ \(.*\): train.global_batch_size: 512"):
        plan_sweep(fixed)


def test_a_throughput_sweep_takes_micro_batches_above_the_systems_global_batch(workdir: Path) -> None:
    """local sets a global batch of 16: a throughput sweep's micro-batches up to 64 (gpu_check.sh's
    micro-batch curve) each train one step's worth, not refused for not dividing 16."""
    request = SweepRequest("local", {"train.micro_batch_size": ["1", "16", "64"]}, synthetic=True)
    plan = plan_sweep(request)
    assert plan.global_batch == [mbs * ranks for mbs, ranks in zip((1, 16, 64), plan.ranks, strict=True)]
    assert plan.points[-1].derived == [f"train.global_batch_size={64 * plan.ranks[-1]}"]


def test_sweep_dry_run_prints_the_plan_and_writes_nothing(workdir: Path) -> None:
    args = [
        "sweep",
        "--system",
        "dgx_h100x8",
        "--grid",
        "train.micro_batch_size=4,32",
        "--grid",
        "nodes=1,4",
        "--synthetic",
        "--submit",
        "--dry-run",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "micro_batch_size x ranks" in result.output and "nothing submitted" in result.output
    assert "1024" in result.output
    assert not (workdir / "runs").exists()
    plan = api.plan_sweep(  # the same plan from Python, with the grid as a mapping
        "dgx_h100x8", {"train.micro_batch_size": [4, 32], "nodes": [1, 4]}, synthetic=True, submit=True
    )
    assert plan.slurm and plan.ranks == [8, 32, 8, 32] and plan.global_batch == [32, 128, 256, 1024]
    assert not (workdir / "runs").exists()


def test_a_huge_grid_is_counted_before_it_is_expanded() -> None:
    """4 keys of 100 values are 10^8 points: one line, at once, without making them."""
    values = ",".join(map(str, range(100)))
    items = [f"{key}={values}" for key in ("a", "b", "c", "d")]
    with pytest.raises(FluxClusterError, match=r"^the grid has 100000000 points; at most 512"):
        parse_grid(items)
    huge = SweepRequest("local", {k: [str(i) for i in range(100)] for k in "abcd"}, synthetic=True)
    with pytest.raises(FluxClusterError, match="100000000 points"):
        plan_sweep(huge)
    result = CliRunner().invoke(app, ["sweep", *(f"--grid={item}" for item in items)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "100000000 points" in result.output


def test_the_api_takes_grid_lists_as_lists_and_keys_as_names(workdir: Path) -> None:
    """{"env.NCCL_ALGO": ["Ring,Tree"]} is one point with that value; a key holding '=' or ',' is refused."""
    from flux_cluster.api.sweeps import _grid_mapping

    assert _grid_mapping({"env.NCCL_ALGO": ["Ring,Tree"], "nodes": [1, 2]}) == {
        "env.NCCL_ALGO": ["Ring,Tree"],
        "nodes": ["1", "2"],
    }
    for bad, why in (
        ({"env.X=1,2": [1]}, "grid key 'env.X=1,2': expected a config key"),
        ({"nodes,train.compile": [1]}, "expected a config key"),
        ({"nodes": "12"}, "expected a list of values"),
        ({"nodes": []}, "expected a list of non-empty values"),
        ({"nodes": iter(range(10**9))}, "more than 512 values"),
    ):
        with pytest.raises(FluxClusterError, match=re.escape(why)):
            api.sweep("local", bad, synthetic=True)
    assert not (workdir / "runs").exists()
