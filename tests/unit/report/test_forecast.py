"""flux-cluster forecast (issue 40): the communication count, the step fit, convergence from the installed
RCPs, the 512-GPU GB200 forecast from real 16- and 72-GPU results (tests/data), every format, and bad
input as one line."""

import csv
import io
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from report_samples import GROUP, sample
from test_report_output import _submission
from typer.testing import CliRunner

from flux_cluster import api
from flux_cluster.cli import app
from flux_cluster.config import load_system
from flux_cluster.errors import FluxClusterError
from flux_cluster.report.forecast.model import (
    EFFICIENCY,
    EXPOSED,
    FIXED_SHARE,
    Fabric,
    Sample,
    comm_seconds,
    evaluations,
    fit_steps,
    olympic_sd,
    samples_band,
)
from flux_cluster.report.forecast.points import Forecast, Setup, default_batch, make_setup
from flux_cluster.report.rcp import rcp_file, reference, reference_spread
from flux_cluster.sweepdir import Point, SweepState

__all__ = ["sample"]
TRIM = Path(__file__).resolve().parents[2] / "data" / "mlperf_v51_scaling_trim.tar.xz"
P = 11_891_178_560
"""flux-schnell's parameters (ModelShape.parameters; tests/unit/training checks it against diffusers)."""


@pytest.fixture(scope="module")
def scaling(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scaling")
    with tarfile.open(TRIM) as archive:
        archive.extractall(root, filter="data")
    return root / "mlperf_v51_scaling_trim"


def tyche(root: Path, gpus: int) -> Path:
    return root / f"NVIDIA/results/tyche_ngpu{gpus}_ngc25.09_nemo/flux1"


def fabric(**changes: object) -> Fabric:
    values: dict[str, object] = dict(
        system="s", gpus_per_node=8, scale_up_gbps=900.0, scale_up_domain=8, scale_out_gbps=50.0
    )
    return Fabric(**(values | changes))  # type: ignore[arg-type]


def test_communication_counts_the_sharded_collectives_over_the_links_they_cross() -> None:
    # plain FSDP over 512 GPUs of NVL72 racks: 8 bytes a parameter (bf16 gathers twice, fp32 reduce) over
    # NVLink (72 members a rack: the racks' NICs together outrun it)
    nvl = fabric(gpus_per_node=4, scale_up_domain=72)
    comm = comm_seconds(P, 2, 512, nvl, "world")
    assert comm.bytes == pytest.approx(8 * P * 511 / 512)
    assert comm.seconds == pytest.approx(comm.bytes / (900e9 * EFFICIENCY))
    # HSDP on 8-GPU nodes: the shard group on NVLink, the replicas' float32 all-reduce on one NIC each
    hsdp = comm_seconds(P, 2, 16, fabric(), None)
    shard, replicas = 8 * P * 7 / 8, 2 * 4 * P / 8 * 1 / 2
    assert hsdp.bytes == pytest.approx(shard + replicas)
    assert hsdp.seconds == pytest.approx(shard / (900e9 * 0.8) + replicas / (50e9 * 0.8))
    assert "shard groups of 8" in hsdp.text and "2 replicas" in hsdp.text
    # FSDP over 2 nodes of 8: leaves a node through its 8 NICs (400 GB/s), less than NVLink
    flat = comm_seconds(P, 2, 16, fabric(), "world")
    assert flat.seconds == pytest.approx(8 * P * 15 / 16 / (400e9 * 0.8))
    assert comm_seconds(P, 2, 1, fabric(), None).seconds == 0.0
    # gradient accumulation: every micro-batch gathers the parameters again, the gradients reduce once
    again = comm_seconds(P, 2, 8, fabric(), None, gathers=3)
    assert again.bytes == pytest.approx((2 * 2 * 3 + 4) * P * 7 / 8) and "3 micro-batches" in again.text
    # --inter-bandwidth: a measured bus bandwidth across nodes; --bandwidth the NVLink one, each for its links
    assert comm_seconds(P, 2, 16, fabric(measured_out_gbps=200.0), "world").seconds == pytest.approx(
        8 * P * 15 / 16 / 200e9
    )
    assert comm_seconds(P, 2, 8, fabric(measured_out_gbps=200.0), "world").seconds == pytest.approx(
        8 * P * 7 / 8 / 720e9
    )  # within a node the datasheet NVLink still counts
    assert comm_seconds(P, 2, 16, fabric(measured_gbps=100.0), "world").seconds == pytest.approx(
        8 * P * 15 / 16 / 100e9
    )  # a measured bus bandwidth is taken as measured
    with pytest.raises(FluxClusterError, match=r"interconnect.scale_out_gbps: not set"):
        comm_seconds(P, 2, 16, fabric(scale_out_gbps=None), None)


def test_the_step_fit_recovers_the_overlapped_model_in_both_regimes() -> None:
    # t = a + max(b m, c) + e min(b m, c): 2 and 8 per GPU are communication-bound, 32 compute-bound
    a, b, e, c = 0.02, 0.003, EXPOSED, 0.05
    steps = [Sample(m, 8, a + max(b * m, c) + e * min(b * m, c), 0.0) for m in (2, 8, 32)]
    fit = fit_steps(steps, [c] * 3, e)
    assert (fit.fixed_s, fit.per_sample_s, fit.batches) == (pytest.approx(a), pytest.approx(b), (2, 8, 32))
    assert fit.residual == pytest.approx(0.0, abs=1e-12) and fit.measured_fixed
    assert fit.step(4, 0.2) == pytest.approx(a + 0.2 + e * 4 * b)  # the compute hides under comm but e of it
    # an exact fit still has a band that grows away from the measured batches: the inputs' noise
    assert 0 < fit.prediction_error(16, 0.02) < fit.prediction_error(128, 0.02)
    # one batch: the fixed part is assumed (a share of the measured compute), the step there is kept
    one = [Sample(32, 8, 0.5, 0.0)]
    none, some = fit_steps(one, [0.1], e, 0.0), fit_steps(one, [0.1], e, FIXED_SHARE)
    assert none.fixed_s == 0.0 and some.fixed_s > 0 and not some.measured_fixed
    assert none.step(32, 0.1) == pytest.approx(0.5) and some.step(32, 0.1) == pytest.approx(0.5)
    assert some.step(4, 0.0) > none.step(4, 0.0)  # what the assumption moves: the smaller batches
    with pytest.raises(FluxClusterError, match="do not grow with the per-GPU batch"):
        fit_steps([Sample(32, 8, 0.5, 0.0)], [0.6])


def _setup(system: str) -> Setup:
    config = load_system(system).config
    return make_setup(
        config, dp_shard=None, bandwidth=(None, None), ruleset="5.1.0", ruleset_from="--ruleset", price=None
    )


def test_convergence_is_the_rcp_the_checker_uses_with_its_olympic_spread() -> None:
    assert 0.3 < olympic_sd(10) < 0.4  # the olympic mean of 10 runs varies about a third of one run's sd
    assert evaluations(10_733_340, 2048, 262_144) == math.ceil(10_733_340 / 262_144)
    assert evaluations(1_000_000, 2304, 262_144) == math.ceil(1_000_000 / (114 * 2304))
    setup = _setup("gb200_nvl72")
    assert setup.params == P and setup.price == 6.49
    assert default_batch(setup, 72) == 2304  # the system's own batch
    assert default_batch(setup, 512) == 4096  # the largest preset within 32 per GPU that splits
    with pytest.raises(FluxClusterError, match="no batch preset"):
        default_batch(setup, 100)
    # a system without a global batch (dgx_b200x8, nodes: 1): a run at 64 GPUs takes the reference's 512,
    # not 64 per GPU as if the one configured node's share held at every scale
    b200 = _setup("dgx_b200x8")
    assert default_batch(b200, 64) == 512 and default_batch(b200, 16) == 512


def _olympic_means(ruleset: str) -> dict[int, float]:
    data = json.loads(rcp_file(ruleset, "flux1").read_text())
    return {int(r["BS"]): statistics.fmean(sorted(r["samples to converge"])[1:-1]) for r in data.values()}


def test_the_convergence_band_carries_the_spread_between_the_reference_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spread, compared = reference_spread()
    assert compared == ("5.1.0", "6.0.0")  # 6.1.0's file is 6.0.0's: counted once
    old, new = _olympic_means("5.1.0"), _olympic_means("6.0.0")
    # the batches both keep: the checker prunes 6.0.0's 1024 (slower than the line between its neighbours)
    logs = [math.log(old[b] / new[b]) for b in (512, 2048, 4096)]
    assert spread == pytest.approx(math.sqrt(statistics.fmean(x * x for x in logs) / 2))
    assert 0.03 < spread < 0.07
    # one distinct file: nothing to compare
    monkeypatch.setattr("flux_cluster.mlperf_rules.RULESETS", ("6.0.0", "6.1.0"))
    reference_spread.cache_clear()
    try:
        assert reference_spread() == (0.0, ())
    finally:
        monkeypatch.undo()
        reference_spread.cache_clear()
    # the band: above the point only; at a measured batch at least one reference run's spread, the
    # reference sets' spread where larger, and one more spread per batch doubling away
    mean, sd = 15_000_000.0, 300_000.0
    low, point, high = samples_band(mean, sd, 0.9, 0.0, systematic=0.0)
    assert (low, point) == (mean, mean)
    assert high == pytest.approx(mean + 2 * math.hypot(olympic_sd() * sd, sd))
    wider = samples_band(mean, sd, 1.1, 0.0, systematic=0.05)[2] - 1.1 * mean
    assert wider == pytest.approx(2 * math.hypot(olympic_sd() * sd, 0.05 * mean))
    far = samples_band(mean, sd, 1.1, 2.0, systematic=0.05)[2] - 1.1 * mean
    assert far == pytest.approx(2 * math.sqrt((olympic_sd() * sd) ** 2 + (2 * sd) ** 2 + (0.05 * mean) ** 2))


def test_the_512_gpu_gb200_point_from_the_16_and_72_gpu_results(sample: Path, scaling: Path) -> None:
    def at_512(bandwidth: float | None = None) -> Forecast:
        return api.forecast(
            [sample / GROUP, tyche(scaling, 72)],
            system="gb200_nvl72",
            targets=[tyche(scaling, 512)],
            ruleset="5.1.0",
            dp_shard="world",
            bandwidth=bandwidth,
        )

    result = at_512()
    (row,) = result.rows
    assert (row.gpus, row.global_batch_size, row.per_gpu_batch) == (512, 2048, 4)
    assert row.actual_minutes == pytest.approx(17.91264166666667)  # the official score
    # the official score inside the band, the point within 10% (docs/benchmarks.md); the band is wider than
    # the issue's +-30%: 8x below the measured per-GPU batch, the fixed part is not measured and the step is
    # communication-bound, so it is as good as the bandwidth known (--bandwidth narrows it)
    assert row.inside and abs(row.error or 1) < 0.1
    assert row.minutes_high / row.minutes - 1 < 0.45 and 1 - row.minutes_low / row.minutes < 0.45
    measured = at_512(720.0).rows[0]
    assert measured.minutes_high - measured.minutes_low < row.minutes_high - row.minutes_low
    # which part missed by how much: the step (NeMo's 0.184 s at 4 per GPU), the convergence (the RCP at
    # 2048 times tyche's own ratio at 512 and 2304)
    assert row.actual_samples_per_s == pytest.approx(2048 / 0.1841, rel=0.01)
    assert row.rate_error == pytest.approx(row.samples_per_s / row.actual_samples_per_s - 1)
    assert -0.2 < (row.rate_error or 1) < 0 and -0.1 < (row.samples_error or 1) < 0
    assert row.actual_samples_to_converge == pytest.approx(11_436_032)
    assert row.extrapolated and "extrapolated: 4 per GPU, measured 32 (one per-GPU batch" in row.basis
    assert "fixed part assumed" in row.basis and not result.model["fixed_measured"]
    # the 4-per-GPU step is mostly what does not shrink: the modelled communication
    step = float(re.search(r"step ([\d.]+) s", row.basis).group(1))  # type: ignore[union-attr]
    comm = float(re.search(r"comm ([\d.]+) s", row.basis).group(1))  # type: ignore[union-attr]
    assert comm > step / 2
    ref = reference("5.1.0", 2048)
    assert row.samples_to_converge_low == pytest.approx(ref.mean)  # a faster submission is scaled to it
    assert row.samples_to_converge > ref.mean  # the inputs converged slower than the RCP: carried over
    assert result.model["convergence_ratio"] > 1.0
    spread = result.model["convergence_reference_spread"]
    assert spread == reference_spread()[0]
    assert f"the spread between the 5.1.0 and 6.0.0 RCP sets, {spread:.1%} sd" in row.basis


def test_every_format_and_the_deadline(sample: Path, scaling: Path, tmp_path: Path) -> None:
    cli = CliRunner()
    base = ["forecast", "--from", str(sample / GROUP), "--system", "gb200_nvl72", "--ruleset", "5.1.0"]
    base += ["--gpus", "16,72", "--gpus", "512:2048", "--dp-shard", "world"]
    table = cli.invoke(app, [*base, "--deadline", "60"])
    assert table.exit_code == 0, table.output
    assert "512" in table.stdout and "deadline 60 minutes: the cheapest point" in table.stdout
    document = json.loads(cli.invoke(app, [*base, "-f", "json"]).stdout)
    assert [r["gpus"] for r in document["rows"]] == [16, 72, 512]
    assert {"minutes", "minutes_low", "minutes_high", "usd", "basis", "samples_to_converge_high"} <= set(
        document["rows"][0]
    )
    assert document["rows"][0]["batch_from"] == "preset" and document["rows"][2]["batch_from"] == "given"
    rows = list(csv.DictReader(io.StringIO(cli.invoke(app, [*base, "-f", "csv"]).stdout)))
    assert float(rows[1]["minutes"]) == pytest.approx(document["rows"][1]["minutes"])
    markdown = cli.invoke(app, [*base, "-f", "md"]).stdout
    assert markdown.startswith("# flux-cluster forecast") and "| GPUs |" in markdown
    out = tmp_path / "f.html"
    assert cli.invoke(app, [*base, "-f", "html", "-o", str(out)]).exit_code == 0
    page = out.read_text()
    assert "<svg" in page and "minutes to train" in page and "USD per run" in page

    # a target whose folder name starts like a formula stays text in the CSV
    odd = tmp_path / "=cmd" / GROUP
    shutil.copytree(sample / GROUP, odd)
    shutil.copytree(sample / GROUP.parents[2] / "systems", tmp_path / "=cmd" / GROUP.parents[2] / "systems")
    target = cli.invoke(app, [*base[:7], "--target", str(odd), "-f", "csv"])
    (row,) = csv.DictReader(io.StringIO(target.stdout))
    assert row["target"].startswith("'/") or row["target"].startswith("/")  # no leading '=' reaches a sheet
    assert float(row["actual_minutes"]) == pytest.approx(160.70693958333334)


def _sweep(folder: Path, sizes: list[int], step_ms: float = 50.0) -> Path:
    points = []
    for index, size in enumerate(sizes):
        point = Point(index=index, values={"train.micro_batch_size": str(size)}, status="ok")
        step = (step_ms + 5.0 * size) / 1000
        point.result = {
            "world_size": 1, "global_batch_size": size, "micro_batch_size": size, "model": "tiny",
            "samples_per_s": size / step, "samples_per_s_per_gpu": size / step,
            "step_time_ms_p50": step * 1000, "step_time_ms_p90": step * 1100,
        }  # fmt: skip
        point.run_dir = str(folder / f"p{index}")
        points.append(point)
    state = SweepState(
        name=folder.name, system="local", job="throughput", grid={"train.micro_batch_size": [str(sizes)]},
        overrides=[], synthetic=True, max_parallel=None, here=False, created_at=0.0, points=points,
    )  # fmt: skip
    folder.mkdir(parents=True)
    state.save(folder)
    return folder


def test_a_sweep_gives_the_fixed_and_per_sample_parts(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path / "mbs", [2, 4, 8, 16])
    result = api.forecast([sweep], system="local", gpus=[(2, 16), (1, 8)])
    assert result.model["fixed_s"] == pytest.approx(0.05) and result.model["per_sample_s"] == pytest.approx(
        0.005
    )
    two, one = result.rows
    assert one.samples_per_s == pytest.approx(8 / 0.09)  # measured: the fit gives it back
    assert two.samples_per_s < 2 * one.samples_per_s  # 2 ranks pay the collectives of the tiny model
    assert "shard groups of 2" in two.basis and "nothing measured converged" in two.basis


def test_bad_input_is_one_line(sample: Path, tmp_path: Path) -> None:
    cli = CliRunner()

    def error(*args: str) -> str:
        result = cli.invoke(app, ["forecast", *args])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1, result.output
        return lines[0]

    one = _sweep(tmp_path / "one", [8, 8])
    assert "one per-GPU batch (8)" in error("--from", str(one), "--system", "local", "--gpus", "2")
    unconverged = tmp_path / "never" / GROUP
    unconverged.mkdir(parents=True)
    shutil.copytree(sample / GROUP.parents[2] / "systems", tmp_path / "never" / GROUP.parents[2] / "systems")
    for log in sorted((sample / GROUP).glob("result_*.txt"))[:3]:
        text = log.read_text().replace(
            '"key": "target_accuracy", "value": 0.586', '"key": "target_accuracy", "value": 0.1'
        )
        (unconverged / log.name).write_text(text)
    assert "no converged run" in error("--from", str(unconverged), "--system", "gb200_nvl72", "--gpus", "16")
    source = ["--from", str(sample / GROUP), "--system", "gb200_nvl72", "--ruleset", "5.1.0"]
    assert "above every RCP" in error(*source, "--gpus", "64:8192")
    assert "--gpus 'x'" in error(*source, "--gpus", "x")
    assert "no such file" in error("--from", str(tmp_path / "nothing"), "--system", "local", "--gpus", "2")
    assert "trained model 'tiny'" in error(
        "--from", str(_sweep(tmp_path / "t", [2, 4])), "--system", "gb200_nvl72", "--gpus", "8"
    )


def test_a_band_end_the_measured_steps_rule_out_is_dropped_not_the_forecast(sample: Path) -> None:
    # a measured NVLink bus bandwidth at which the modelled communication is 90% of the measured step: the
    # slow end of the measured range (0.8 of it) would need more than the step; the forecast stands
    plain = api.forecast([sample / GROUP], system="gb200_nvl72", gpus=[16], ruleset="5.1.0", dp_shard="world")
    step = plain.inputs[0]["step_s"]
    gbps = 8 * P * 15 / 16 / (0.9 * step) / 1e9
    result = api.forecast(
        [sample / GROUP],
        system="gb200_nvl72",
        gpus=[(16, 512)],
        ruleset="5.1.0",
        dp_shard="world",
        bandwidth=gbps,
    )
    (row,) = result.rows
    assert result.model["band_ends_dropped"] == ["bandwidth at its slow end"]
    assert "band ends the measured steps rule out: bandwidth at its slow end" in row.basis
    assert row.samples_per_s == pytest.approx(512 / step, rel=0.01)  # the measured point given back


def test_one_per_gpu_batch_widens_the_band_away_from_it_and_noise_widens_an_exact_fit(
    sample: Path, tmp_path: Path
) -> None:
    result = api.forecast(
        [sample / GROUP], system="gb200_nvl72", gpus=[(16, 512), (16, 128)], ruleset="5.1.0"
    )
    at, below = result.rows
    assert not at.extrapolated and below.extrapolated and "fixed part assumed" in below.basis
    width = [r.samples_per_s_high / r.samples_per_s_low for r in (at, below)]
    assert width[1] > width[0]
    # two batches fitted exactly (residual 0), steps spread 10% p90 over p50: the band still grows away
    sweep = _sweep(tmp_path / "mbs", [2, 4, 8, 16])
    rows = api.forecast([sweep], system="local", gpus=[(1, 8), (1, 64)]).rows
    assert rows[1].extrapolated and not rows[0].extrapolated
    near, far = (r.samples_per_s_high / r.samples_per_s_low for r in rows)
    assert 1 < near < far


def test_accumulation_regathers_and_the_evaluation_assumption(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path / "mbs", [2, 4, 8, 16])
    (row,) = api.forecast([sweep], system="local", gpus=[(2, 32)]).rows  # 16 a GPU, micro-batch 8
    assert "gathered for 2 micro-batches" in row.basis and "1/3 of a training sample" in row.basis
    (recomputed,) = api.forecast(
        [sweep], system="local", gpus=[(2, 16)], overrides=["train.activation_checkpointing=full"]
    ).rows
    assert "1/4 of a training sample" in recomputed.basis and "recomputes the forward" in recomputed.basis


def test_small_cli_edges(sample: Path, tmp_path: Path) -> None:
    cli = CliRunner()
    base = ["forecast", "--from", str(sample / GROUP), "--system", "gb200_nvl72"]
    zero = cli.invoke(app, [*base, "--gpus", "0"])
    assert zero.exit_code == 2 and zero.output.strip().count("\n") == 0, zero.output
    assert "--gpus 0: expected GPUs >= 1" in zero.output and "None" not in zero.output
    free = cli.invoke(app, [*base, "--ruleset", "5.1.0", "--gpus", "16", "--price", "0", "-f", "json"])
    assert json.loads(free.stdout)["rows"][0]["usd"] == 0.0
    table = cli.invoke(app, [*base, "--ruleset", "5.1.0", "--gpus", "16", "--price", "0"]).stdout
    assert " 0.00 " in table
    assumed = cli.invoke(app, [*base, "--gpus", "16"]).stdout  # the sample's logs do not name a ruleset
    assert "(assumed: the logs do not say; give --ruleset)" in assumed and "from assumed" not in assumed
    # --deadline picks among the forecasts, never a --target row (a check, not a choice)
    result = api.forecast(
        [sample / GROUP],
        system="gb200_nvl72",
        gpus=[72],
        targets=[sample / GROUP],
        ruleset="5.1.0",
        deadline=1e6,
    )
    assert result.deadline is not None and result.deadline["gpus"] == 72  # the target's 16 GPUs cost less
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "forecast_validation.py"
    shown = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, check=False
    )
    assert shown.returncode == 0 and "usage: forecast_validation.py" in shown.stdout, shown.stderr


def test_forecast_takes_the_format_names_report_takes(sample: Path) -> None:
    cli = CliRunner()
    source = ["--from", str(sample / GROUP), "--system", "gb200_nvl72", "--ruleset", "5.1.0", "--gpus", "16"]
    for name in ("table", "json", "csv", "md", "html"):
        assert cli.invoke(app, ["forecast", *source, "-f", name]).exit_code == 0, name
        assert cli.invoke(app, ["report", str(sample), "--no-check", "-f", name]).exit_code == 0, name
    forecast = cli.invoke(app, ["forecast", *source, "-f", "markdown"])
    report = cli.invoke(app, ["report", str(sample), "--no-check", "-f", "markdown"])
    assert forecast.exit_code == report.exit_code == 2
    names = [
        re.search(r"is not one of (.*?)\. \(see", " ".join(r.output.split())) for r in (forecast, report)
    ]
    assert names[0] and names[1] and names[0][1] == names[1][1] == "'table', 'json', 'csv', 'md', 'html'"


def _edited_group(sample: Path, root: Path, edit: Callable[[str], str]) -> Path:
    """The sample's ten runs (report's test copy of its layout), each log through ``edit``."""
    group = _submission(sample, root, runs=10)
    for log in group.glob("result_*.txt"):
        log.write_text(edit(log.read_text()))
    return group


def test_a_tensor_parallel_layout_in_the_logs_is_said(sample: Path, tmp_path: Path) -> None:
    # 6.1.0 logs carry tensor_parallelism: a target run with TP 4 is a comparison across layouts, and an
    # input run with it is fitted as if it were data-parallel; both said, neither silent
    line = ':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": '
    layout = _edited_group(
        sample,
        tmp_path / "tp4",
        lambda text: text + line + '"tensor_parallelism", "value": 4, "metadata": {}}\n',
    )
    plain = api.forecast([sample / GROUP], system="gb200_nvl72", targets=[sample / GROUP], ruleset="5.1.0")
    assert "tensor parallelism" not in plain.rows[0].basis and not plain.warnings
    tp = api.forecast([layout], system="gb200_nvl72", targets=[layout], ruleset="5.1.0")
    assert "the target ran tensor parallelism 4 (its logs)" in tp.rows[0].basis
    assert [w for w in tp.warnings if f"{layout}: ran tensor parallelism 4" in w]
    one = api.forecast([sample / GROUP], system="gb200_nvl72", targets=[layout], ruleset="5.1.0", gpus=[72])
    assert not one.warnings and "tensor parallelism 4" in one.rows[-1].basis  # the target only


def test_the_error_split_counts_the_samples_the_score_counts(sample: Path, tmp_path: Path) -> None:
    # a target that converged faster than its RCP is scored as if it took the RCP mean: its convergence
    # share of the error is against that, not against the samples it took (the sample's 8.39 M samples
    # read at a batch of 1024, whose RCP mean is 8.75 M)
    def at_1024(text: str) -> str:
        return text.replace(
            '"key": "global_batch_size", "value": 512', '"key": "global_batch_size", "value": 1024'
        )

    faster = _edited_group(sample, tmp_path / "faster", at_1024)
    (row,) = api.forecast([sample / GROUP], system="gb200_nvl72", targets=[faster], ruleset="5.1.0").rows
    mean = reference("5.1.0", 1024).mean
    assert row.actual_samples_to_converge == pytest.approx(8_388_608) and mean > 8_388_608
    assert row.samples_error == pytest.approx(row.samples_to_converge / mean - 1)
    (same,) = api.forecast(
        [sample / GROUP], system="gb200_nvl72", targets=[sample / GROUP], ruleset="5.1.0"
    ).rows
    assert same.actual_samples_to_converge == pytest.approx(8_388_608)
    assert reference("5.1.0", 512).mean < 8_388_608
    assert same.samples_error == pytest.approx(same.samples_to_converge / 8_388_608 - 1)
    assert same.rate_error == pytest.approx(0.0, abs=1e-9)  # its own throughput, at its own scale
