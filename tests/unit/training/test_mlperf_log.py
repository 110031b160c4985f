"""flux1 result logs against the official MLPerf compliance checker, for every ruleset we support."""

from pathlib import Path

import pytest
from checker import compliance_check

from flux_cluster.config import load_system
from flux_cluster.config.workload import load_workload, resolve_training, run_deviations
from flux_cluster.jobs.compliance import compliance_verdict
from flux_cluster.jobs.compliance import main as compliance_step
from flux_cluster.mlperf_rules import (
    RULESETS,
    Deviation,
    Ruleset,
    closed_division_deviations,
    logged_deviations,
)
from flux_cluster.training.mlperf_log import MlperfLog, RunFacts, evaluation_frequency


def write_run(
    path: Path,
    ruleset: Ruleset,
    *,
    gbs: int = 512,
    final_loss: float = 0.55,
    eval_every_steps: int | None = None,
    deviations: tuple[Deviation, ...] = (),
) -> None:
    """The timeline the training job writes: header, blocks of training, evals, run_stop."""
    facts = RunFacts(
        submission_org="flux-cluster",
        submission_platform="2xCPU",
        global_batch_size=gbs,
        micro_batch_size=gbs // 2,
        learning_rate=2e-4,
        warmup_steps=1600,
        train_samples=1_099_776,
        eval_samples=29_696,
        config_filename="configs/benchmarks/flux1.yaml",
        seed=7,
        eval_every_steps=eval_every_steps,
        deviations=deviations,
    )
    log = MlperfLog(path, enabled=True)
    log.header(facts, ruleset, cache_cleared=True)
    log.end("init_stop")
    log.start("run_start")
    interval = evaluation_frequency("6.0.0", gbs, eval_every_steps)
    for i, loss in enumerate((0.9, 0.7, final_loss), start=1):
        log.start("block_start", metadata={"samples_count": (i - 1) * interval})
        log.end("block_stop", metadata={"samples_count": i * interval})
        log.start("eval_start", metadata={"samples_count": i * interval})
        log.eval_accuracy(loss, i * interval)
        log.end("eval_stop", metadata={"samples_count": i * interval})
    log.run_stop(success=final_loss <= 0.586, samples=3 * interval)
    log.close()


@pytest.mark.parametrize("ruleset", RULESETS)
def test_log_passes_the_official_checker(ruleset: Ruleset, tmp_path: Path) -> None:
    log = tmp_path / "result_0.txt"
    write_run(log, ruleset)
    result = compliance_check(log, ruleset)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "SUCCESS" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("ruleset", "key"),
    [
        ("5.1.0", "opt_adamw_beta_2"),
        ("6.0.0", "evaluation_frequency"),
        ("6.1.0", "micro_batch_size"),
        ("6.1.0", "run_stop"),
    ],
)
def test_checker_fails_without_a_required_key(ruleset: str, key: str, tmp_path: Path) -> None:
    log = tmp_path / "result_0.txt"
    write_run(log, ruleset)  # type: ignore[arg-type]
    kept = [line for line in log.read_text().splitlines() if f'"key": "{key}"' not in line]
    assert len(kept) < len(log.read_text().splitlines())
    log.write_text("\n".join(kept) + "\n")
    assert compliance_check(log, ruleset).returncode != 0


def test_evaluation_frequency_follows_the_ruleset(tmp_path: Path) -> None:
    """GBS 1000: 262 steps are 262,000 samples, so evals come every 263 steps = 263,000 samples (6.x)."""
    assert evaluation_frequency("5.1.0", 1000) == 262_144
    assert evaluation_frequency("6.1.0", 1000) == 263_000
    assert evaluation_frequency("6.0.0", 512) == 262_144
    log = tmp_path / "result_0.txt"
    write_run(log, "6.1.0", gbs=1000)
    assert compliance_check(log, "6.1.0").returncode == 0
    assert compliance_check(log, "5.1.0").returncode != 0  # 5.1.0 wants the nominal 262144


def test_a_run_that_misses_the_target_is_aborted_and_not_compliant(tmp_path: Path) -> None:
    log = tmp_path / "result_0.txt"
    write_run(log, "6.1.0", final_loss=0.6)
    assert '"status": "aborted"' in log.read_text()
    assert compliance_check(log, "6.1.0").returncode != 0


def test_only_rank_zero_writes(tmp_path: Path) -> None:
    path = tmp_path / "result_1.txt"
    log = MlperfLog(path, enabled=False)
    log.event("cache_clear", value=True)
    assert not path.exists()


def test_facts_are_checked_at_construction() -> None:
    with pytest.raises(ValueError, match="multiple"):
        RunFacts("o", "p", 100, 32, 1e-4, 0, 1, 1, "c.yaml")


def _deviations(system: str, *sets: str) -> list[Deviation]:
    plan = resolve_training(load_system(system, list(sets)).config)
    presets = load_workload(plan.train.benchmark)[0].batch_presets.keys()
    return closed_division_deviations(plan.train.model_dump(), plan.mlperf.model_dump(), presets, 4096, 512)


def test_the_logged_eval_interval_is_the_real_one(tmp_path: Path) -> None:
    """--system local evaluates every 50 steps of 16 samples: the log says 800, and the official checker
    (which wants 262,144) rejects it under every ruleset."""
    assert evaluation_frequency("6.1.0", 16, 50) == evaluation_frequency("5.1.0", 16, 50) == 800
    assert evaluation_frequency("5.1.0", 16, 16384) == 262_144  # the closed interval keeps 5.1.0's value
    for ruleset in RULESETS:
        log = tmp_path / f"result_{ruleset}.txt"
        write_run(log, ruleset, gbs=16, eval_every_steps=50)
        assert '"key": "evaluation_frequency", "value": 800,' in log.read_text()
        outcome = compliance_check(log, ruleset)
        assert outcome.returncode != 0 and "CHECK for 'evaluation_frequency' failed" in outcome.stderr


def test_settings_that_break_the_closed_rules_are_named() -> None:
    reasons = [d.reason for d in _deviations("local")]
    assert reasons == [
        "model tiny (the benchmark trains flux-schnell)",
        "global batch 16 has no reference preset (512, 1024, 2048, 2304, 4096)",
        "evaluates every 800 samples (50 steps), not every 262,144 (16384 steps)",
        "sample budget 16,000 (train.max_samples), below the workload's 40,000,000",
        "4,096 train samples, not flux1's 1,099,776",
        "512 val samples, not flux1's 29,696",
    ]
    assert [d.log_key for d in _deviations("local")][2] == "evaluation_frequency"
    target = _deviations("local", "train.target=0.7")
    assert ("target loss 0.7, not 0.586", "eval_accuracy") in [(d.reason, d.log_key) for d in target]
    target = _deviations("local", "train.target=0.01")  # stricter: the checker cannot object to it
    assert ("target loss 0.01, not 0.586", None) in [(d.reason, d.log_key) for d in target]
    # the benchmark's own settings on a real system conform (the dataset sizes aside, given here as 4096/512)
    real = [d.reason for d in _deviations("dgx_h100x8", "paths.data_root=/d")]
    assert real == ["4,096 train samples, not flux1's 1,099,776", "512 val samples, not flux1's 29,696"]
    plan = resolve_training(
        load_system("dgx_h100x8", ["paths.data_root=/d", "train.eval_every_steps=512"]).config
    )
    assert run_deviations({"training": plan.model_dump(mode="json")}) == []
    plan = resolve_training(load_system("local").config)
    assert len(run_deviations({"training": plan.model_dump(mode="json")})) == 4  # the report's view
    assert run_deviations({"name": "preflight"}) == []


def test_the_compliance_step_labels_a_non_conforming_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job's compliance line: a conforming log passes; the tiny run's log is NON-CONFORMING with its
    reasons, and the checker's rejection of evaluation_frequency is expected; anything else fails."""
    good = tmp_path / "result_0.txt"
    write_run(good, "6.1.0")
    assert logged_deviations(good) == []
    assert compliance_verdict(good, "6.1.0", tmp_path / "c0.log") == (
        "result_0.txt passed the MLPerf 6.1.0 compliance check",
        0,
    )
    assert "SUCCESS" in (tmp_path / "c0.log").read_text()

    tiny = tmp_path / "result_1.txt"
    write_run(tiny, "6.1.0", gbs=16, eval_every_steps=50, deviations=tuple(_deviations("local")))
    assert logged_deviations(tiny) == [d.reason for d in _deviations("local")]
    said = capsys.readouterr().out  # the job's output says it too, once
    assert (
        said.count("NON-CONFORMING") == 1 and "[train] NON-CONFORMING: not an MLPerf closed-division" in said
    )
    assert compliance_step([str(tiny), "--ruleset", "6.1.0", "--log-output", str(tmp_path / "c1.log")]) == 0
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and line.startswith("result_1.txt is NON-CONFORMING, not an MLPerf result: ")
    assert (
        "evaluates every 800 samples" in line
        and "rejects evaluation_frequency for that, nothing else" in line
    )
    assert "FAILED" in (tmp_path / "c1.log").read_text()

    broken = tmp_path / "result_2.txt"  # non-conforming and missing a key: a real failure
    broken.write_text(
        "".join(x for x in tiny.read_text().splitlines(True) if "opt_base_learning_rate" not in x)
    )
    line, code = compliance_verdict(broken, "6.1.0", tmp_path / "c2.log")
    details = f"(details: {tmp_path / 'c2.log'})"
    assert code == 1
    assert line == f"error: result_2.txt (non-conforming) failed the MLPerf 6.1.0 compliance check {details}"


def test_a_job_script_from_before_the_move_still_runs_the_compliance_step(tmp_path: Path) -> None:
    """Job scripts rendered before the step moved to flux_cluster.jobs.compliance (a job requeued after an
    upgrade reruns its old script) run `python -m flux_cluster.mlperf_rules check ...`: the same step runs,
    with its line, its log and its exit code; anything else there is one line, exit 2."""
    import subprocess
    import sys

    from flux_cluster.launch.plan import COMPLIANCE_MODULE

    def old_step(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "flux_cluster.mlperf_rules", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    good, broken = tmp_path / "result_0.txt", tmp_path / "result_1.txt"
    write_run(good, "6.1.0")
    broken.write_text(
        "".join(x for x in good.read_text().splitlines(True) if "opt_base_learning_rate" not in x)
    )
    done = old_step("check", "--ruleset", "6.1.0", "--log-output", str(tmp_path / "c0.log"), str(good))
    assert (done.returncode, done.stdout) == (0, "result_0.txt passed the MLPerf 6.1.0 compliance check\n")
    assert "SUCCESS" in (tmp_path / "c0.log").read_text()
    done = old_step("check", "--ruleset", "6.1.0", "--log-output", str(tmp_path / "c1.log"), str(broken))
    assert (
        done.returncode == 1 and "error: result_1.txt failed the MLPerf 6.1.0 compliance check" in done.stderr
    )
    assert "FAILED" in (tmp_path / "c1.log").read_text()
    done = old_step("verify", str(good))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and COMPLIANCE_MODULE in done.stderr
    assert COMPLIANCE_MODULE == "flux_cluster.jobs.compliance"
