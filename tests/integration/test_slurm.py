"""Against the real localhost Slurm (slurm/local-cluster.sh): submit, arrays, cancel, requeue, script."""

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from checker import compliance_check
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.launch import slurm
from flux_cluster.rundir import RunRecord, list_runs

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


ONE_NODE = ("--set", "nodes=1")
"""For tests of what is not about several nodes (arrays, dependencies, logs, cancel): one rank per job,
half the work on CI's two cores, and an array's tasks run side by side."""


def launch(cli: CliRunner, *args: str) -> tuple[Path, RunRecord]:
    result = cli.invoke(app, [*args, "--system", "local_slurm"])
    assert result.exit_code == 0, result.output + (result.stderr if result.stderr_bytes else "")
    run_dir = list_runs(Path("runs"))[-1]
    record = RunRecord.load(run_dir)
    assert record is not None and record.launcher == "slurm"
    return run_dir, record


def until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Whether the predicate came true within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def poll(predicate: Callable[[], bool], timeout_s: float = 120, what: str = "condition") -> None:
    if not until(predicate, timeout_s):
        pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def state(job_id: str) -> str:
    return slurm.job_states([job_id])[job_id].split()[0]


def log_text(run_dir: Path, job_id: str) -> str:
    path = run_dir / "slurm" / f"{job_id}_0_log.out"
    return path.read_text() if path.exists() else ""


def test_preflight_on_two_nodes_completes_and_reports_bandwidth(
    cli: CliRunner, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "hf_secret_value_never_written_91c2"
    monkeypatch.setenv("HF_TOKEN", secret)
    run_dir, record = launch(cli, "preflight", "--wait", "--set", "secrets=[HF_TOKEN]")
    (job_id,) = record.job_ids
    assert state(job_id) == "COMPLETED"
    log = log_text(run_dir, job_id)
    assert re.search(r"all_reduce bus bandwidth \d+\.\d+ GB/s", log) and "preflight: PASSED" in log
    report = json.loads((run_dir / "results" / "preflight_0.json").read_text())
    assert report["passed"] and len(report["ranks"]) == 2
    assert {r["slurm_node"] for r in report["ranks"]} == {"n1", "n2"}  # one rank per emulated node
    # The script Slurm ran is byte-identical to the one in the run directory.
    assert slurm.batch_script(job_id) == (run_dir / "job.sh").read_text()
    # The secret went by name: its value is nowhere in the run directory.
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert "HF_TOKEN" in (run_dir / "job.sh").read_text()
    assert "secret HF_TOKEN is not set" not in log  # the job read it from the private folder
    # status/logs through the CLI
    # slurmdbd may hold the first node only for a moment after the job ends, under load: poll.
    poll(lambda: "n[1-2]" in cli.invoke(app, ["status", str(run_dir)]).output, 30, "sacct to list both nodes")
    status = cli.invoke(app, ["status", str(run_dir)])
    assert status.exit_code == 0 and "COMPLETED" in status.output and "n[1-2]" in status.output
    logs = cli.invoke(app, ["logs", str(run_dir)])
    assert logs.exit_code == 0 and "preflight: PASSED" in logs.output


def test_nexp_array_gives_runs_with_distinct_seeds(cli: CliRunner, workdir: Path) -> None:
    run_dir, record = launch(cli, "preflight", "--nexp", "3", "--seed", "100", *ONE_NODE, "--wait")
    assert record.array and len(record.job_ids) == 3
    assert all(state(job_id) == "COMPLETED" for job_id in record.job_ids)
    seeds = set()
    for index, job_id in enumerate(record.job_ids):
        match = re.search(rf"\(index {index}\): seed (\d+)", log_text(run_dir, job_id))
        assert match, log_text(run_dir, job_id)
        seeds.add(int(match.group(1)))
        assert (run_dir / "results" / f"preflight_{index}.json").is_file()
    assert seeds == {100, 101, 102}
    assert cli.invoke(app, ["logs", str(run_dir), "--task", "5"]).exit_code == 2


def test_nexp_serial_runs_every_repeat_in_one_allocation(cli: CliRunner, workdir: Path) -> None:
    run_dir, record = launch(
        cli, "preflight", "--nexp", "2", "--set", "mlperf.nexp_mode=serial", *ONE_NODE, "--wait"
    )
    (job_id,) = record.job_ids
    log = log_text(run_dir, job_id)
    assert "(index 0)" in log and "(index 1)" in log
    assert sorted(p.name for p in (run_dir / "results").glob("preflight_*.json")) == [
        "preflight_0.json",
        "preflight_1.json",
    ]


def test_cancel_a_running_job(cli: CliRunner, workdir: Path) -> None:
    run_dir, record = launch(cli, "preflight", "--soak-seconds", "300", *ONE_NODE)
    (job_id,) = record.job_ids
    poll(lambda: state(job_id) == "RUNNING", what="the job to run")
    result = cli.invoke(app, ["cancel", str(run_dir)])
    assert result.exit_code == 0 and job_id in result.output
    poll(lambda: state(job_id) == "CANCELLED", what="CANCELLED")


def test_job_requeues_itself_after_its_signal_and_resumes(cli: CliRunner, workdir: Path) -> None:
    # The USR1 comes 6 s after the job's start, in the soak or before it (the rest runs after the requeue):
    # the 8 s soak alone outlasts those 6 s, however fast the ranks start.
    run_dir, record = launch(cli, "preflight", "--soak-seconds", "8")
    (job_id,) = record.job_ids
    poll(lambda: "repeat 1 of 1" in log_text(run_dir, job_id), what="the soak to start")
    time.sleep(6)
    # What Slurm does at walltime - signal_lead_s (--signal=USR1@lead): USR1 to every rank.
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True)
    poll(lambda: "requeueing job" in log_text(run_dir, job_id), what="the job script to requeue")
    poll(lambda: state(job_id) in slurm.FINAL_STATES, timeout_s=180, what="the requeued job to finish")
    assert state(job_id) == "COMPLETED"
    log = log_text(run_dir, job_id)
    assert "SIGUSR1 received, soak progress saved" in log and "resuming the soak after a requeue" in log
    report = json.loads((run_dir / "results" / "preflight_0.json").read_text())
    assert report["restarts"] >= 1 and report["passed"]


def test_dependency_waits_for_the_first_job(cli: CliRunner, workdir: Path) -> None:
    # One node each: without the dependency both would run at once.
    _, first = launch(cli, "preflight", "--soak-seconds", "4", *ONE_NODE)  # running when the second is queued
    _, second = launch(cli, "preflight", "--dependency", f"afterok:{first.job_ids[0]}", *ONE_NODE, "--wait")
    assert state(second.job_ids[0]) == "COMPLETED" and state(first.job_ids[0]) == "COMPLETED"
    start_second = slurm.job_info(second.job_ids[0])["Start"]
    end_first = subprocess.run(
        ["sacct", "-j", first.job_ids[0], "-X", "-n", "-o", "End"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert start_second >= end_first


def test_the_dependency_forms_taken_are_those_slurmctld_takes() -> None:
    """check_dependency against the real slurmctld: each form it takes is queued (a bare id, ID_*, type
    names in any case, a bare id after the typed parts); the bare-id orders it refuses, sbatch refuses."""
    from flux_cluster.errors import FluxClusterError
    from flux_cluster.launch.plan import check_dependency

    def sbatch(*args: str) -> subprocess.CompletedProcess[str]:
        command = ["sbatch", "--parsable", "--hold", "--partition=debug", "--job-name=dep", *args]
        return subprocess.run([*command, "--wrap", "true"], capture_output=True, text=True, timeout=60)

    job, array = sbatch().stdout.strip(), sbatch("--array=0-1").stdout.strip()
    taken = ["{j}", "{a}_*", "{j},{a}_1", "afterok:{a}_*", "AfterOK:{j}", "SINGLETON", "afterok:{j}?{a}"]
    taken += ["singleton?{j}", "afterok:{j},{a},singleton", "after:{j}+5:{a}", "afterany:{j}?afterok:{a}_1"]
    refused = ["{j}?{a}", "{j},afterok:{a}", "{j}?singleton", "afterok:{a}_0?{j}?{a}_1", "{j}_*?{a}_*"]
    try:
        for form in (f.format(j=job, a=array) for f in taken):
            check_dependency(form)
            queued = sbatch(f"--dependency={form}")
            assert queued.returncode == 0, (form, queued.stderr)
            subprocess.run(["scancel", queued.stdout.strip()], check=True)
        for form in (f.format(j=job, a=array) for f in refused):
            with pytest.raises(FluxClusterError):
                check_dependency(form)
            assert sbatch(f"--dependency={form}").returncode != 0, form
    finally:
        subprocess.run(["scancel", job, array], check=False)


def test_logs_follow_returns_when_the_job_ends(cli: CliRunner, workdir: Path) -> None:
    run_dir, _ = launch(cli, "preflight", "--soak-seconds", "4", *ONE_NODE)
    result = cli.invoke(app, ["logs", str(run_dir), "--follow"])
    assert result.exit_code == 0
    assert "repeat 1 of 1" in result.output and "preflight: PASSED" in result.output


def test_runs_requeue_restarts_a_running_job(cli: CliRunner, workdir: Path) -> None:
    run_dir, record = launch(cli, "preflight", "--soak-seconds", "300", *ONE_NODE)
    (job_id,) = record.job_ids
    poll(lambda: "repeat 1 of 1" in log_text(run_dir, job_id), what="the job to start")
    result = cli.invoke(app, ["runs", "requeue", str(run_dir)])
    assert result.exit_code == 0 and job_id in result.output
    poll(lambda: "restart 1" in log_text(run_dir, job_id), what="the requeued job to start again")
    cli.invoke(app, ["cancel", str(run_dir)])
    poll(lambda: state(job_id) == "CANCELLED", what="CANCELLED")


def test_dry_run_output_runs_under_plain_sbatch(cli: CliRunner, workdir: Path) -> None:
    result = cli.invoke(app, ["preflight", "--system", "local_slurm", *ONE_NODE, "--dry-run"])
    assert result.exit_code == 0
    submitted = subprocess.run(
        ["sbatch", "--parsable"], input=result.stdout, capture_output=True, text=True, check=True, cwd=workdir
    )
    job_id = submitted.stdout.strip().split(";")[0]
    poll(lambda: slurm.is_final(state(job_id)), what="the hand-submitted job to finish")
    assert state(job_id) == "COMPLETED"
    (run_dir,) = list_runs(workdir / "runs")
    assert json.loads((run_dir / "results" / "preflight_0.json").read_text())["passed"]


def test_prepare_data_submit_converts_with_a_two_task_array_and_verifies(
    cli: CliRunner, workdir: Path
) -> None:
    source, root = workdir / "src", workdir / "energon"
    assert cli.invoke(app, ["data", "synth", str(source), "--train", "70", "--val", "16"]).exit_code == 0
    result = cli.invoke(
        app,
        [
            "prepare-data",
            "--system",
            "local_slurm",
            "--submit",
            "--wait",
            "--input",
            str(source),
            "--output",
            str(root),
            "--shard-size",
            "10",
            "--tasks",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    runs = {run.name.rsplit("-", 1)[1]: run for run in list_runs(Path("runs"))}
    assert set(runs) == {"convert", "index", "verify"}
    convert = RunRecord.load(runs["convert"])
    assert convert is not None and convert.array and len(convert.job_ids) == 2
    assert all(state(job_id) == "COMPLETED" for job_id in convert.job_ids)
    # Each array task converted its own range of shards: train 0-6 and val 0-1 are 9 shards, 4 + 5.
    # Progress is on stdout, as for every job.
    logs = [log_text(runs["convert"], job_id) for job_id in convert.job_ids]
    assert "[data] convert task 1 of 2:" in logs[0] and "convert (task 1/2): 40/40 samples" in logs[0]
    assert "[data] convert task 2 of 2:" in logs[1] and "convert (task 2/2): 46/46 samples" in logs[1]
    verify = RunRecord.load(runs["verify"])
    assert verify is not None
    assert "verify: all checks passed" in log_text(runs["verify"], verify.job_ids[0])
    assert (root / ".nv-meta" / "dataset.yaml").is_file()


def test_prepare_data_chain_stops_when_a_stage_fails(cli: CliRunner, workdir: Path) -> None:
    """The input is valid at submission and gone when the delayed convert array starts: it fails, and
    --kill-on-invalid-dep cancels index and verify instead of leaving them pending forever."""
    import shutil

    source = workdir / "src"
    assert cli.invoke(app, ["data", "synth", str(source), "--train", "20", "--val", "8"]).exit_code == 0
    result = cli.invoke(
        app,
        [
            "prepare-data",
            "--system",
            "local_slurm",
            "--submit",
            "--input",
            str(source),
            "--output",
            str(workdir / "energon"),
            "--set",
            "slurm.extra_sbatch=[--begin=now+4]",
        ],
    )
    assert result.exit_code == 0, result.output
    shutil.rmtree(source)
    runs = {run.name.rsplit("-", 1)[1]: RunRecord.load(run) for run in list_runs(Path("runs"))}
    ids = [job_id for record in runs.values() if record for job_id in record.job_ids]
    states = slurm.wait_until_final(ids)
    convert, index, verify = (runs[stage] for stage in ("convert", "index", "verify"))
    assert convert is not None and index is not None and verify is not None
    assert {states[job_id].split()[0] for job_id in convert.job_ids} == {"FAILED"}
    assert states[index.job_ids[0]].startswith("CANCELLED") and states[verify.job_ids[0]].startswith(
        "CANCELLED"
    )


def test_prepare_data_submit_refuses_bad_input_before_submitting(cli: CliRunner, workdir: Path) -> None:
    result = cli.invoke(
        app,
        [
            "prepare-data",
            "--system",
            "local_slurm",
            "--submit",
            "--input",
            str(workdir / "absent"),
            "--output",
            str(workdir / "energon"),
        ],
    )
    assert result.exit_code == 2 and "cc12m_preprocessed: missing" in result.output
    assert not Path("runs").exists() and not (workdir / "absent").exists()


def test_data_encode_submit_encodes_with_a_two_task_array_and_finishes(
    cli: CliRunner, workdir: Path, tiny_pipeline: Path
) -> None:
    """data encode --submit: 12 images are one train and one val chunk, one per array task; the finish
    job writes and verifies the root. A local encode of the same folder finds every chunk in the cache
    under the same key (the options reached the jobs intact) and writes byte-identical shards."""
    import hashlib

    from data_helpers import write_image_folder

    images, cache = workdir / "images", workdir / "cache"
    write_image_folder(images, "captions.txt", 12)

    def encode(out: Path, *more: str) -> str:
        args = ["data", "encode", str(images), str(out), "--model", str(tiny_pipeline), "--cache", str(cache)]
        result = cli.invoke(app, [*args, "--resolution", "64", "--max-sequence-length", "16", *more])
        assert result.exit_code == 0, result.output
        return result.output

    encode(workdir / "slurm-out", "--submit", "--system", "local_slurm", "--tasks", "2", "--wait")
    runs = {run.name.split("local_slurm-", 1)[1]: run for run in list_runs(Path("runs"))}
    assert set(runs) == {"encode", "encode-finish"}
    array, finish = RunRecord.load(runs["encode"]), RunRecord.load(runs["encode-finish"])
    assert array is not None and array.array and len(array.job_ids) == 2 and finish is not None
    samples = json.loads((workdir / "slurm-out" / "flux-encoded.json").read_text())["samples"]
    logs = [log_text(runs["encode"], job_id) for job_id in array.job_ids]
    for task, (log, split) in enumerate(zip(logs, ("train", "val"), strict=True)):
        n = samples[split]
        assert f"encode task {task + 1} of 2: 1 chunk(s) of 2, {n} image(s), {n} encoded now" in log, log
    assert "verify: all checks passed" in log_text(runs["encode-finish"], finish.job_ids[0])

    def shards(root: Path) -> dict[str, str]:
        tars = sorted(root.rglob("*.tar"))
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in tars}

    chunks = {p: p.stat().st_mtime_ns for p in cache.glob("*/chunks/*.arrow")}
    local = encode(workdir / "local-out")
    assert f"all {sum(samples.values())} images of this task are in the cache" in local
    assert {p: p.stat().st_mtime_ns for p in cache.glob("*/chunks/*.arrow")} == chunks
    assert shards(workdir / "local-out") == shards(workdir / "slurm-out") and len(chunks) == 2


def rank_pids(run_dir: Path) -> dict[int, int]:
    """The training ranks of a run on this host (both emulated nodes are localhost), by rank; not their
    loader workers (forked, so with the same command line)."""
    found: dict[int, tuple[int, int]] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = dict(
                item.split(b"=", 1) for item in (proc / "environ").read_bytes().split(b"\0") if b"=" in item
            )
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        ours = b"flux_cluster.jobs.train" in cmdline and str(run_dir).encode() in b" ".join(cmdline)
        if ours and b"SLURM_PROCID" in environ:
            found[int(proc.name)] = (int(environ[b"SLURM_PROCID"]), parent)
    return {rank: pid for pid, (rank, parent) in found.items() if parent not in found}


def test_two_node_training_job_completes_with_a_compliant_log(cli: CliRunner, workdir: Path) -> None:
    """On the way to the target, one rank is SIGKILLed (as in a node crash: no signal to act on, the
    periodic checkpoint by wall time is what is left) and the job requeues itself; later the run is
    requeued with 'runs requeue' (SIGTERM to every process of the job, loader workers included: the
    ranks checkpoint on it). Each attempt resumes where the last checkpoint left it, and the final
    result log is complete. Seed 3 and target 1.12, evaluating every 25 steps: the tiny model passes it at
    step 75 (1.10; 1.45 and 1.24 at 25 and 50, well after the restarts): what is tested is the restarts,
    and CI's minutes are short. A checkpoint every 3 s: the test waits little for one, and the first comes
    early enough on a fast machine to leave the restarted run time for another before the target (every
    6 s, a quiet machine checkpointed first at step 39 and reached step 75 before the next: a time-out)."""
    run_dir, record = launch(
        cli, "submit", "--seed", "3", "--set", "mlperf.ruleset=5.1.0", "--set", "train.eval_every_steps=25",
        "--set", "train.checkpoint_every_minutes=0.05", "--set", "train.target=1.12",
    )  # fmt: skip
    (job_id,) = record.job_ids
    checkpoints = run_dir / "checkpoints" / "exp_0"

    def steps() -> list[int]:
        return sorted(int(p.name.removeprefix("step_")) for p in checkpoints.glob("step_*"))

    def resumed_steps() -> list[int]:
        return [int(m) for m in re.findall(r"resumed from \S+ at step (\d+)", log_text(run_dir, job_id))]

    poll(lambda: bool(steps()) and len(rank_pids(run_dir)) == 2, 300, "a periodic checkpoint")
    periodic = steps()[-1]
    os.kill(rank_pids(run_dir)[1], signal.SIGKILL)
    # No 'runs requeue' here: srun reports the rank's signal and the job requeues itself.
    poll(lambda: "requeueing job" in log_text(run_dir, job_id), 120, "the job to requeue itself")
    # srun reports the killed rank's signal, or the SIGTERM it then sent the other (whichever it reaps first)
    requeued = r"a rank was killed by a signal \(srun exit code (137: signal 9|143: signal 15)\) "
    requeued += rf"\(crash requeue 1 of at most 3\): requeueing job {job_id}"
    assert re.search(requeued, log_text(run_dir, job_id)), log_text(run_dir, job_id)
    poll(lambda: bool(resumed_steps()), 300, "the first restart to resume")
    assert resumed_steps()[0] >= periodic and resumed_steps()[0] in steps()

    poll(lambda: len(rank_pids(run_dir)) == 2 and steps()[-1] > resumed_steps()[0], 300, "training again")
    assert cli.invoke(app, ["runs", "requeue", str(run_dir)]).exit_code == 0
    poll(lambda: len(resumed_steps()) == 2, 300, "the second restart to resume")
    stopped = re.findall(r"stopped by a signal at step (\d+)", log_text(run_dir, job_id))
    assert stopped and resumed_steps()[1] == int(stopped[-1]), "resumed from the SIGTERM checkpoint"

    poll(lambda: state(job_id) in slurm.FINAL_STATES, 600, "the training job to finish")
    assert state(job_id) == "COMPLETED"
    log = log_text(run_dir, job_id)
    assert "2 ranks (1 x 1 HSDP)" not in log and "2 ranks (1 x 2 HSDP)" not in log
    assert "2 ranks (2 x 1 HSDP)" in log  # one rank per node: replicas across the 2 nodes
    assert "run_stop success" in log and "failed the MLPerf compliance check" not in log
    errors = (run_dir / "slurm" / f"{job_id}_0_log.err").read_text()
    assert "DataLoader worker" not in errors, errors[-3000:]
    assert len(list((run_dir / "results" / "interrupted").glob("result_0.attempt*.txt"))) == 2
    assert "result_0.txt is NON-CONFORMING" in log  # the job's own compliance line: a demonstration
    verdict = compliance_check(run_dir / "results" / "result_0.txt", "5.1.0")  # evals every 800 samples
    assert verdict.returncode != 0 and "CHECK for 'evaluation_frequency' failed" in verdict.stderr
    assert "FAILED" in (run_dir / "results" / "compliance_0.log").read_text()  # the job's own check


def test_training_with_a_short_walltime_checkpoints_requeues_and_finishes(
    cli: CliRunner, workdir: Path
) -> None:
    """2 minutes of walltime with USR1 60 s before the end (Slurm may send it up to 60 s earlier): once
    training has begun, the test holds the ranks (SIGSTOP), so the first attempt cannot reach the target
    before the signal on any machine (a fast one did); Slurm continues a step it signals, and the USR1
    makes the ranks checkpoint and the job requeue itself. The requeued job gets 10 minutes, so the
    second attempt resumes and finishes (more 2-minute attempts would only repeat the first one's path).
    Target 1.12: seed 3 passes it at the evaluation at step 75 (1.10; 25 and 50 give 1.45 and 1.24), so
    the second attempt is short; what is tested is the signal, the requeue and the resume."""
    run_dir, record = launch(
        cli, "submit", "--seed", "3", "--set", "slurm.walltime=2", "--set", "mlperf.ruleset=6.0.0",
        "--set", "train.eval_every_steps=25", "--set", "train.target=1.12"
    )  # fmt: skip
    (job_id,) = record.job_ids
    metrics = run_dir / "results" / "metrics_0.jsonl"
    poll(lambda: metrics.is_file() and '"step"' in metrics.read_text(), 120, "training to begin")
    ranks = list(rank_pids(run_dir).values())
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    started = datetime.fromisoformat(slurm.job_info(job_id)["Start"])
    # Held until the signal has come (Slurm continues the ranks itself and they requeue the job), or at
    # most until 75 s after the start, by when it is due: no fixed wait for the latest possible signal.
    due = (started + timedelta(seconds=75) - datetime.now()).total_seconds()
    until(lambda: "requeueing job" in log_text(run_dir, job_id), due)
    for pid in ranks:  # they may be gone by now
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    poll(lambda: "requeueing job" in log_text(run_dir, job_id), 120, "the walltime signal to requeue the job")
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "TimeLimit=10"], check=True)
    poll(lambda: state(job_id) in slurm.FINAL_STATES, timeout_s=600, what="the training job to finish")
    assert state(job_id) == "COMPLETED"
    log = log_text(run_dir, job_id)
    assert "requeueing job" in log and "resumed from" in log and "run_stop success" in log
    interrupted = sorted((run_dir / "results" / "interrupted").glob("result_0.attempt*.txt"))
    assert interrupted and all('"status": "aborted"' in p.read_text() for p in interrupted)
    final = (run_dir / "results" / "result_0.txt").read_text()
    assert '"key": "resumed_from_checkpoint"' in final and '"status": "success"' in final
