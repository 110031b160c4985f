"""The embedded default: --system local runs the job on this machine with 2 processes (gloo), no Slurm."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.rundir import RunRecord, list_runs, read_run_config

# What every GPU system runs by default, on the CPU: bf16 compute with every block checkpointed.
GPU_DEFAULTS = ("--set", "train.param_dtype=bfloat16", "--set", "train.activation_checkpointing=full")


def test_local_preflight_runs_two_ranks(cli: CliRunner, workdir: Path) -> None:
    result = cli.invoke(app, ["preflight", "--system", "local", "--seed", "11", *GPU_DEFAULTS])
    assert result.exit_code == 0, result.output
    assert re.search(r"all_reduce bus bandwidth \d+\.\d+ GB/s", result.output)
    (run_dir,) = list_runs(workdir / "runs")
    assert run_dir.parent.name == "preflight" and run_dir.name.endswith("-local")
    system, job = read_run_config(run_dir / "config.yaml")
    assert system.name == "local" and job["seed_base"] == 11 and system.mlperf.seed_base == 11
    report = json.loads((run_dir / "results" / "preflight_0.json").read_text())
    assert report["passed"] and [r["rank"] for r in report["ranks"]] == [0, 1]
    assert all(r["backend"] == "gloo" for r in report["ranks"])
    for rank in report["ranks"]:  # every rank trained one block of the system's model with its settings
        check = rank["model_check"]
        assert check["ok"], check
        assert check["settings"] == (
            "tiny block, mbs 8, bfloat16, activation checkpointing full, compile off, attention auto"
        )
        assert check["attention_kernel"] == "math" and check["step_ms"] > 0
        assert check["step_tflops"] > 0 and check["gemm_peak_tflops"] > 0
    assert "model step per GPU" in result.output
    record = RunRecord.load(run_dir)
    assert record is not None and record.exit_code == 0
    status = cli.invoke(app, ["status"])
    assert status.exit_code == 0 and "COMPLETED" in status.output
    listing = cli.invoke(app, ["runs", "list"], env={"COLUMNS": "200"})
    assert "preflight" in listing.output and "COMPLETED" in listing.output


def test_local_preflight_fails_on_a_missing_data_root(cli: CliRunner, workdir: Path) -> None:
    result = cli.invoke(
        app,
        [
            "preflight",
            "--system",
            "local",
            "--set",
            f"paths.data_root={workdir / 'absent'}",
            "--runs-dir",
            str(workdir / "r"),
        ],
    )
    assert result.exit_code != 0
    assert "FAILED" in result.output and "missing or not a directory" in result.output
    # an expected failure: the preflight's verdict, never torchrun's ChildFailedError traceback
    assert "Traceback" not in result.output and "ChildFailedError" not in result.output


def test_local_preflight_fails_in_one_line_when_the_model_step_cannot_run(
    cli: CliRunner, workdir: Path
) -> None:
    """cuDNN attention does not exist on a CPU: a stand-in for a stack whose kernels fail (as cuDNN's
    SDPA backward did on H100). The preflight must fail and say why, per rank, in one line."""
    result = cli.invoke(app, ["preflight", "--system", "local", "--set", "train.attention_backend=cudnn"])
    assert result.exit_code == 1, result.output
    (verdict,) = [line for line in result.output.splitlines() if line.startswith("preflight: FAILED")]
    for rank in (0, 1):
        assert re.search(
            rf"rank {rank}: the model step failed \(tiny block, .*attention cudnn\): RuntimeError: "
            r"train\.attention_backend 'cudnn' cannot run attention on cpu",
            verdict,
        ), verdict
    assert "Traceback" not in result.output and "[launch]" not in result.output  # said once, by the ranks
    (run_dir,) = list_runs(workdir / "runs")
    report = json.loads((run_dir / "results" / "preflight_0.json").read_text())
    assert not report["passed"] and all(not r["model_check"]["ok"] for r in report["ranks"])


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_cancel_stops_every_process_of_a_local_run(cli: CliRunner, workdir: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "flux_cluster",
        "preflight",
        "--system",
        "local",
        "--soak-seconds",
        "120",
    ]
    runner = subprocess.Popen(
        command, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 60
    while True:
        runs = list_runs(workdir / "runs")
        if runs and len(_processes_mentioning(str(runs[0] / "config.yaml"))) >= 2:  # both ranks are up
            break
        assert time.monotonic() < deadline, "the local run did not start"
        time.sleep(0.2)
    result = cli.invoke(app, ["cancel"])
    assert result.exit_code == 0 and "stopped local run" in result.output
    output, _ = runner.communicate(timeout=30)
    assert runner.returncode != 0
    # the submitting shell: one line from the launcher and the verdict, no torchrun traceback
    assert "Traceback" not in output and "[launch] stopped by SIGTERM" in output, output
    assert ": CANCELLED (no checkpoint written)" in output, output
    deadline = time.monotonic() + 20
    while _processes_mentioning(str(runs[0])):
        assert time.monotonic() < deadline, "ranks survived the cancel"
        time.sleep(0.2)
    status = cli.invoke(app, ["status"], env={"COLUMNS": "300"})
    assert "CANCELLED" in status.output and "FAILED" not in status.output, status.output


HOLDER = """
import sys, time
from pathlib import Path
from flux_cluster.rundir import lock_repeat
lock = lock_repeat(Path(sys.argv[1]), 0)
print("locked", flush=True)
time.sleep(120)
"""


def prepared_local_run(cli: CliRunner, workdir: Path) -> Path:
    result = cli.invoke(app, ["submit", "--system", "local", "--dry-run"])
    assert result.exit_code == 0, result.output
    (run_dir,) = list_runs(workdir / "runs")
    return run_dir


def test_a_second_attempt_of_a_repeat_is_refused_while_the_first_runs(cli: CliRunner, workdir: Path) -> None:
    from flux_cluster.errors import FluxClusterError
    from flux_cluster.rundir import lock_repeat

    run_dir = prepared_local_run(cli, workdir)
    RunRecord(launcher="local", job_ids=[], submitted_at=time.time(), pid=None, exit_code=75).save(run_dir)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    try:
        lock_repeat(run_dir, 0)
    except FluxClusterError as exc:
        assert f"another attempt of repeat 0 is still running (pid {holder.pid} on " in str(exc)
        assert "\n" not in str(exc)
    else:
        raise AssertionError("two attempts must not hold the same repeat")
    # a repeat resumed by hand (bash job.sh) is running, whatever the first attempt's record says
    assert "RUNNING" in cli.invoke(app, ["status"]).output
    holder.kill()
    holder.wait()
    assert lock_repeat(run_dir, 0) is not None  # released with its process
    assert "FAILED (exit 75)" in cli.invoke(app, ["status"]).output


def test_status_of_a_killed_run_and_of_one_that_resumed_later(cli: CliRunner, workdir: Path) -> None:
    run_dir = prepared_local_run(cli, workdir)
    # The runner still blocked on output the orphaned ranks hold open: the killed script is a zombie.
    zombie = subprocess.Popen(["bash", "-c", "exit 0"])
    deadline = time.monotonic() + 10
    while "zombie" not in Path(f"/proc/{zombie.pid}/status").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    RunRecord(launcher="local", job_ids=[], submitted_at=time.time(), pid=zombie.pid).save(run_dir)
    status = cli.invoke(app, ["status"]).output
    assert "RUNNING" not in status and "FAILED (the runner was killed" in status, status
    zombie.wait()
    # The killed attempt recorded a failure; the repeat then resumed by hand and finished.
    record = RunRecord(launcher="local", job_ids=[], submitted_at=time.time(), pid=zombie.pid, exit_code=-9)
    record.save(run_dir)
    (run_dir / "state").mkdir(exist_ok=True)
    (run_dir / "state" / "exp_0.done").touch()
    status = cli.invoke(app, ["status"]).output
    assert "COMPLETED" in status and "FAILED" not in status, status


def test_cancel_stops_what_holds_the_run_lock_and_status_names_the_checkpoint(
    cli: CliRunner, workdir: Path
) -> None:
    """A job.sh killed with -9 left its rank holding the repeat's lock: cancel stops that holder, and the
    run reads as CANCELLED with its last checkpoint, not as FAILED or 'not running'."""
    run_dir = prepared_local_run(cli, workdir)
    RunRecord(launcher="local", job_ids=[], submitted_at=time.time(), pid=None).save(run_dir)
    checkpoint = run_dir / "checkpoints" / "exp_0" / "step_00000020"
    checkpoint.mkdir(parents=True)
    (run_dir / "checkpoints" / "exp_0" / "step_00000010").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert "RUNNING" in cli.invoke(app, ["status"]).output
        result = cli.invoke(app, ["cancel"])
        assert result.exit_code == 0 and f"lock holder {holder.pid}" in result.output, result.output
        assert holder.wait(timeout=10) == -15
    finally:
        holder.kill()
        holder.wait()
    status = cli.invoke(app, ["status"], env={"COLUMNS": "400"})
    # the API opens a run by its absolute path (the same run after a chdir), so status names it so
    assert f"CANCELLED (checkpoint {checkpoint.absolute()})" in status.output, status.output
    assert "is not running" in cli.invoke(app, ["cancel"]).output


def test_cancel_never_signals_a_process_through_a_planted_lock_file(cli: CliRunner, workdir: Path) -> None:
    """state/exp_<i>.lock is read from a folder others may write: a symlink to another program's lock
    must not make 'cancel' stop that program."""
    run_dir = prepared_local_run(cli, workdir)
    RunRecord(launcher="local", job_ids=[], submitted_at=time.time(), pid=None).save(run_dir)
    elsewhere = workdir / "elsewhere"
    elsewhere.mkdir()
    bystander = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(elsewhere)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert bystander.stdout is not None and bystander.stdout.readline().strip() == "locked"
        (run_dir / "state").mkdir(exist_ok=True)
        (run_dir / "state" / "exp_0.lock").symlink_to(elsewhere / "state" / "exp_0.lock")
        assert "is not running" in cli.invoke(app, ["cancel"]).output
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
