"""flux1 result logs against the official MLPerf compliance checker, for every ruleset we support."""

from pathlib import Path

import pytest
from checker import compliance_check

from flux_cluster.mlperf_rules import RULESETS, Ruleset
from flux_cluster.training.mlperf_log import MlperfLog, RunFacts, evaluation_frequency


def write_run(path: Path, ruleset: Ruleset, *, gbs: int = 512, final_loss: float = 0.55) -> None:
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
    )
    log = MlperfLog(path, enabled=True)
    log.header(facts, ruleset, cache_cleared=True)
    log.end("init_stop")
    log.start("run_start")
    interval = evaluation_frequency("6.0.0", gbs)
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
