"""The job script's own logic, executed by bash with recording stand-ins for srun/scontrol/docker:
failures stop the job, the requeue marker leads to 'scontrol requeue', docker relays the signal."""

import signal
import time
from pathlib import Path

import pytest
import stand_ins

from flux_cluster.config import SystemConfig, load_system


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    stand_ins.install(tmp_path / "bin")
    return tmp_path / "bin"


def case_dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    return path


def test_a_failing_comm_test_stops_serial_repeats(tmp_path: Path, bin_dir: Path) -> None:
    config = load_system("dgx_h100x8", ["mlperf.nexp=3", "mlperf.clear_caches=false"], environ={}).config
    case = case_dir(tmp_path, "serial")
    script = stand_ins.render_case(config, case)
    code, output = stand_ins.run(script, bin_dir, rules=[{"match": "--comm-only", "exit": 1}])
    assert code != 0, output
    assert "the all_reduce test failed" in output
    assert not list((case / "run" / "state").glob("exp_*.done"))
    assert not any("flux_cluster.jobs.train" in " ".join(c["argv"]) for c in stand_ins.calls(case))


def test_a_failing_training_step_fails_the_array_task(tmp_path: Path, bin_dir: Path) -> None:
    config = load_system("mi300x8", ["mlperf.nexp=4"], environ={}).config
    case = case_dir(tmp_path, "array")
    script = stand_ins.render_case(config, case)
    code, output = stand_ins.run(
        script, bin_dir, rules=[{"match": "flux_cluster.jobs.train", "exit": 3}], array_task="2"
    )
    assert code == 3 and "experiment 2 ended without reaching the quality target (exit code 3)" in output
    code, output = stand_ins.run(
        script, bin_dir, rules=[{"match": "flux_cluster.jobs.train", "exit": 1}], array_task="2"
    )
    assert code == 1 and "experiment 2 failed with exit code 1" in output
    ok, _ = stand_ins.run(script, bin_dir, array_task="2")
    assert ok == 0 and (case / "run" / "state" / "exp_2.done").exists()


@pytest.mark.parametrize("requeue_works", [True, False])
def test_requeue_marker_makes_the_script_requeue(tmp_path: Path, bin_dir: Path, requeue_works: bool) -> None:
    config = load_system("local_slurm", ["mlperf.nexp=2", "mlperf.nexp_mode=serial"], environ={}).config
    case = case_dir(tmp_path, "requeue")
    script = stand_ins.render_case(config, case)
    marker = case / "run" / "state" / "requeue-42"
    rules = [{"match": "flux_cluster.jobs.train", "touch": str(marker)}]  # rank 0, after a checkpoint
    if not requeue_works:
        rules.insert(0, {"match": "scontrol requeue", "exit": 1})
    code, output = stand_ins.run(script, bin_dir, rules=rules)
    requeues = [c["argv"] for c in stand_ins.calls(case) if c["argv"][:2] == ["scontrol", "requeue"]]
    assert requeues == [["scontrol", "requeue", "42"]]
    assert not marker.exists(), "the marker is consumed, so the restarted job does not requeue again"
    assert not (case / "run" / "state" / "exp_0.done").exists()
    trains = [c for c in stand_ins.calls(case) if "flux_cluster.jobs.train" in " ".join(c["argv"])]
    assert len(trains) == 1, "no further repeat starts in an allocation that is being requeued"
    if requeue_works:
        assert code == 0
    else:
        assert code == 1 and "scontrol requeue failed" in output


@pytest.mark.parametrize(
    ("train_exit", "marker", "crashes", "requeued"),
    [
        (137, False, 1, True),  # a rank SIGKILLed (a node crash, the OOM killer): resume from a checkpoint
        (1, False, 0, False),  # an error: it would fail again at every start
        (3, False, 0, False),  # the target not reached: so would this
        (137, False, 2, False),  # slurm.max_requeues crash requeues reached
        (0, True, 2, True),  # the time-limit requeue made progress: never counted
    ],
)
def test_a_rank_killed_by_a_signal_requeues_the_job_up_to_max_requeues(
    tmp_path: Path, bin_dir: Path, train_exit: int, marker: bool, crashes: int, requeued: bool
) -> None:
    config = load_system("local_slurm", ["slurm.max_requeues=2"], environ={}).config
    case = case_dir(tmp_path, "crash")
    script = stand_ins.render_case(config, case)
    count = case / "run" / "state" / "crash_requeues"
    count.parent.mkdir(parents=True, exist_ok=True)
    count.write_text(f"{crashes}\n")
    rule: dict[str, object] = {"match": "flux_cluster.jobs.train", "exit": train_exit}
    if marker:
        rule["touch"] = str(case / "run" / "state" / "requeue-42")
    code, output = stand_ins.run(script, bin_dir, rules=[rule])
    requeues = [c["argv"] for c in stand_ins.calls(case) if c["argv"][:2] == ["scontrol", "requeue"]]
    assert requeues == ([["scontrol", "requeue", "42"]] if requeued else []), output
    assert not (case / "run" / "state" / "exp_0.done").exists()
    if requeued and not marker:
        why = "a rank was killed by a signal (srun exit code 137: signal 9)"
        assert code == 0 and f"{why} (crash requeue 2 of at most 2): requeueing job 42" in output
        assert count.read_text().strip() == "2"
    elif requeued:
        assert code == 0 and count.read_text().strip() == "2"  # unchanged
    elif crashes == 2:
        (line,) = [line for line in output.splitlines() if "max_requeues" in line]
        assert code == 1 and "error: " in line and "already requeued 2 time(s) after a crash" in line, output
    else:
        assert code == train_exit and "requeue" not in output, output


def test_docker_relays_the_batch_signal_into_the_containers(tmp_path: Path, bin_dir: Path) -> None:
    config = load_system(
        "mi300x8", ["mlperf.comm_test=false", "mlperf.check_compliance=false"], environ={}
    ).config
    case = case_dir(tmp_path, "relay")
    script = stand_ins.render_case(config, case)
    process = stand_ins.start(script, bin_dir, rules=[{"match": "flux_cluster.jobs.train", "sleep": 4}])
    deadline = time.monotonic() + 20
    while not any("flux_cluster.jobs.train" in " ".join(c["argv"]) for c in stand_ins.calls(case)):
        assert time.monotonic() < deadline, "the training step never started"
        time.sleep(0.1)
    process.send_signal(signal.SIGUSR1)  # what Slurm does with --signal=B:USR1@lead
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    relays = [c["argv"] for c in stand_ins.calls(case) if c["argv"][-1] == "relay"]
    assert relays and relays[0][:2] == ["srun", "--overlap"]
    assert "--env=FLUX_PID_DIR" in relays[0] and "flux_cluster.jobs.signals" in relays[0]
    removed = [c["argv"] for c in stand_ins.calls(case) if "rm" in c["argv"] and "--force" in c["argv"]]
    assert len(removed) == 2, "a stale container is removed before the start, and ours at the end"


# A stand-in for the node's nvidia-smi: `nvidia-smi -L` prints $SMI_LIST and exits with $SMI_EXIT.
NVIDIA_SMI = """#!/bin/bash
[[ $* == -L ]] || exit 64
printf '%s' "${SMI_LIST:-}"
exit "${SMI_EXIT:-0}"
"""
H100 = "GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i}a6b6f2e-1b2c-4d5e-8f90-a1b2c3d4e5f6)\n"
UUID = "GPU-{i}a6b6f2e-1b2c-4d5e-8f90-a1b2c3d4e5f6"
TWO_GPUS = H100.format(i=0) + H100.format(i=1)  # the step's two GPUs, behind a device cgroup
FOUR_GPUS = "".join(H100.format(i=i) for i in range(4))  # every GPU of a node without one
MIG = (  # a MIG slice Slurm gave the step, under its GPU
    "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)\n"
    "  MIG 1g.5gb      Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)\n"
)
HOSTILE = "GPU 0: x (UUID: GPU-$(touch pwned))\nGPU 1: y (UUID: GPU-a,GPU-b)\n"  # never a UUID
NO_ANSWER = ("", 9)  # nvidia-smi failed (or is missing)
REFUSED = "the job asked Slurm for GPUs, but this step names none"


def _without_gres(config: SystemConfig) -> SystemConfig:
    return config.model_copy(update={"slurm": config.slurm.model_copy(update={"gres_gpus": False})})


def _start_on_each_node(config: SystemConfig, case: Path, bin_dir: Path) -> list[str]:
    """What srun runs on each node to start the container (the rendered evaluate job, run with stand-ins)."""
    code, output = stand_ins.run(stand_ins.render_case(config, case, job="evaluate"), bin_dir)
    assert code == 0, output
    (start,) = [c["argv"] for c in stand_ins.calls(case) if "run" in c["argv"] and "--detach" in c["argv"]]
    assert start[0] == "srun"
    return start[start.index("bash") :]


def _container_sees(
    on_node: list[str], case: Path, bin_dir: Path, step_gpus: str, smi: tuple[str, int], names: list[str]
) -> tuple[int, str, list[str | None]]:
    """Run the start on a node whose step has SLURM_STEP_GPUS and whose nvidia-smi says smi: (its exit code,
    its stderr, each of names as the container gets it from docker/podman's --env=NAME; [] if none started).
    Slurm's cgroup-relative CUDA_VISIBLE_DEVICES and a user's CUDA_DEVICE_ORDER are set before."""
    import subprocess

    seen: list[str | None] = []
    for name in names:
        (case / "record.jsonl").unlink(missing_ok=True)
        env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "HOME": str(case),
            "RECORD_FILE": str(case / "record.jsonl"),
        }
        env |= {
            "PROBE_VAR_NAME": name,
            "SLURM_STEP_GPUS": step_gpus,
            "SMI_LIST": smi[0],
            "SMI_EXIT": str(smi[1]),
        }
        env |= {
            "CUDA_VISIBLE_DEVICES": "0",
            "ROCR_VISIBLE_DEVICES": "0",
            "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
        }
        done = subprocess.run(on_node, env=env, cwd=case, capture_output=True, text=True, timeout=60)
        started = [c for c in stand_ins.calls(case) if c["argv"][1:2] == ["run"]]
        if done.returncode != 0:
            assert started == []
            return done.returncode, done.stderr, []
        (call,) = started
        seen.append(call["probe"])
    return 0, "", seen


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_an_nvidia_container_sees_the_gpus_its_step_can_open_by_uuid(
    tmp_path: Path, bin_dir: Path, runtime: str
) -> None:
    """docker/podman on NVIDIA: the container gets the UUIDs of the GPUs nvidia-smi lists in the step (a
    device cgroup hides the others; a MIG slice in place of its GPU) when they are as many as Slurm names,
    or when Slurm names none; else (no cgroup, or no answer) Slurm's indices in PCI bus order. A job that
    asked for GPUs never gets every GPU of the node: no GPU named and none listed is one line, exit 1."""
    (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    config = load_system("dgx_h100x8", [f"container.runtime={runtime}"], environ={}).config
    from flux_cluster.launch.evaluate_jobs import evaluate_slurm_system

    case = case_dir(tmp_path, "nvidia")
    on_node = _start_on_each_node(evaluate_slurm_system(config, ()), case, bin_dir)
    assert {"--env=CUDA_VISIBLE_DEVICES", "--env=CUDA_DEVICE_ORDER"} <= set(on_node)
    names = ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"]
    both = f"{UUID.format(i=0)},{UUID.format(i=1)}"
    for step_gpus, smi, expected in [
        ("0,1", (TWO_GPUS, 0), [both, None]),  # the step's own two, whatever their PCI order
        ("3", (MIG, 0), ["MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f", None]),
        ("", (TWO_GPUS, 0), [both, None]),  # Slurm names none, the cgroup shows two: those
        ("0,1", (FOUR_GPUS, 0), ["0,1", "PCI_BUS_ID"]),  # no cgroup: Slurm's indices
        ("0,1", NO_ANSWER, ["0,1", "PCI_BUS_ID"]),
        ("2", (HOSTILE, 0), ["2", "PCI_BUS_ID"]),
    ]:
        assert _container_sees(on_node, case, bin_dir, step_gpus, smi, names) == (0, "", expected), step_gpus
    assert not (case / "pwned").exists()
    code, stderr, seen = _container_sees(on_node, case, bin_dir, "", NO_ANSWER, names)
    assert code == 1 and seen == [] and stderr.count("\n") == 1 and REFUSED in stderr, stderr

    no_gres = evaluate_slurm_system(_without_gres(config), ())
    case = case_dir(tmp_path, "no-gres")
    on_node = _start_on_each_node(no_gres, case, bin_dir)
    assert _container_sees(on_node, case, bin_dir, "", NO_ANSWER, names) == (0, "", [None, None])  # every GPU


def test_an_amd_container_sees_slurms_gpus_and_never_every_gpu_of_a_job_that_asked_for_some(
    tmp_path: Path, bin_dir: Path
) -> None:
    """docker on AMD: the step's SLURM_STEP_GPUS become ROCR_VISIBLE_DEVICES (rocm-smi cannot say which
    GPUs a step may open); none named is one line for a job that asked for GPUs, every GPU for one that
    did not (slurm.gres_gpus false)."""
    from flux_cluster.launch.evaluate_jobs import evaluate_slurm_system

    config = load_system("mi300x8", [], environ={}).config
    case = case_dir(tmp_path, "amd")
    on_node = _start_on_each_node(evaluate_slurm_system(config, ()), case, bin_dir)
    assert "--env=ROCR_VISIBLE_DEVICES" in on_node
    names = ["ROCR_VISIBLE_DEVICES"]
    assert _container_sees(on_node, case, bin_dir, "0,1", NO_ANSWER, names) == (0, "", ["0,1"])
    assert _container_sees(on_node, case, bin_dir, "5", NO_ANSWER, names) == (0, "", ["5"])
    code, stderr, _ = _container_sees(on_node, case, bin_dir, "", NO_ANSWER, names)
    assert code == 1 and stderr.count("\n") == 1 and REFUSED in stderr and "nvidia-smi" not in stderr
    case = case_dir(tmp_path, "no-gres")
    on_node = _start_on_each_node(evaluate_slurm_system(_without_gres(config), ()), case, bin_dir)
    assert _container_sees(on_node, case, bin_dir, "", NO_ANSWER, names) == (0, "", [None])


def test_a_log_that_fails_the_compliance_check_fails_the_job(tmp_path: Path, bin_dir: Path) -> None:
    config = load_system("local_slurm", ["mlperf.nexp=2", "mlperf.nexp_mode=serial"], environ={}).config
    case = case_dir(tmp_path, "compliance")
    script = stand_ins.render_case(config, case)
    code, output = stand_ins.run(
        script, bin_dir, rules=[{"match": "flux_cluster.jobs.compliance", "exit": 1}]
    )
    assert code == 1, output
    assert "repeat index 0 finished" not in output
    assert not list((case / "run" / "state").glob("exp_*.done"))


@pytest.mark.parametrize(
    ("system", "sets", "expected"),
    [
        ("dgx_h100x8", [], {"--cpus-per-task=14", "--mem=224G", "--gpus-per-node=1", "--ntasks-per-node=1"}),
        ("mi300x8", [], {"--cpus-per-task=12", "--mem=176G", "--gpus-per-node=1"}),
        # derived from the node's totals: an eighth of mem; cores are per task already
        (
            "dgx_h100x8",
            ["slurm.one_gpu_mem=null", "slurm.mem=1800G"],
            {"--mem=230400M", "--cpus-per-task=14"},
        ),
        # mem '0' (the whole node) and no one_gpu_mem: no --mem at all (Slurm's per-CPU default)
        ("dgx_h100x8", ["slurm.one_gpu_mem=null", "slurm.one_gpu_cpus=8"], {"--cpus-per-task=8"}),
    ],
)
def test_the_evaluate_job_asks_for_one_gpu_and_its_share_not_the_node(
    system: str, sets: list[str], expected: set[str]
) -> None:
    from flux_cluster.launch.evaluate_jobs import evaluate_slurm_system
    from flux_cluster.launch.plan import make_plan
    from flux_cluster.launch.render import allocation

    config = evaluate_slurm_system(load_system(system, sets, environ={}).config, ())
    lines = allocation(make_plan(config, "evaluate", Path("/runs/evaluate/x"), "evaluate", 0))
    directives = {line.removeprefix("#SBATCH ") for line in lines}
    assert expected <= directives, directives
    assert "--exclusive" not in directives
    assert {d for d in directives if d.startswith("--mem")} == {e for e in expected if e.startswith("--mem")}
