"""Golden files of every shipped system's rendered script; they also must pass bash -n and shellcheck.

Regenerate after an intended template change:
    .venv/bin/python -m pytest tests/unit/launch/test_golden.py --update-golden
"""

import shutil
import subprocess
from pathlib import Path

import pytest

from flux_cluster.config import known_systems, load_system
from flux_cluster.config.schema import SystemConfig
from flux_cluster.launch.data_jobs import data_job_plan
from flux_cluster.launch.evaluate_jobs import evaluate_slurm_system
from flux_cluster.launch.plan import ArrayPlan, make_plan
from flux_cluster.launch.render import render_array, render_script
from flux_cluster.launch.submit import throughput_args

GOLDEN = Path(__file__).parents[2] / "golden"
CASES = [(name, job, 1) for name in known_systems() for job in ("train", "preflight")] + [
    ("dgx_h100x8", "train", 10),  # NVIDIA style: 10 repeats in one allocation
    ("mi300x8", "train", 10),  # array of 10
]
# the throughput job (a sweep's point) on synthetic batches: NVIDIA, AMD, this machine
CASES += [(name, "throughput", 1) for name in ("dgx_h100x8", "mi300x8", "local")]
# prepare-data's conversion array on every Slurm system (the 'local' system runs stages in-process).
CASES += [(name, "data-convert", 1) for name in known_systems() if name != "local"]
# a sweep's array: three throughput points sharing an allocation, two at a time, after other jobs
CASES += [(name, "sweep-array", 1) for name in ("dgx_h100x8", "mi300x8", "local_slurm")]
# the one-GPU evaluate job: one GPU's share of a node, not the whole node
CASES += [(name, "evaluate", 1) for name in ("dgx_h100x8", "mi300x8")]


def render_case(system: str, job: str, nexp: int) -> str:
    overrides = [f"mlperf.nexp={nexp}", "mlperf.seed_base=1234"]
    if job == "throughput":  # --synthetic: launch drops the data root (no mount, no check)
        overrides.append("paths.data_root=null")
    config = load_system(system, overrides, environ={}).config
    run_dir = Path(f"/runs/{job}/20260101-000000-{system}")
    if job == "sweep-array":
        return render_array(sweep_array(config))
    if job == "evaluate":
        config = evaluate_slurm_system(config, ())
    if job.startswith("data-"):
        plan = data_job_plan(config, job.removeprefix("data-"), run_dir, "prepare-data", "afterok:1000")
    else:
        job_args = (*throughput_args(5, 20), "--synthetic") if job == "throughput" else ()
        plan = make_plan(config, job, run_dir, job, 1234, job_args)
    plan = type(plan)(**{**plan.__dict__, "python_fallback": "python3"})
    return render_script(plan)


def sweep_array(config: SystemConfig) -> ArrayPlan:
    sweep = Path("/runs/sweep-mbs")
    job_args = (*throughput_args(5, 20), "--synthetic")
    first = make_plan(config, "throughput", sweep / "20260101-000000-p000", "sweep-mbs", 1234, job_args)
    first = type(first)(**{**first.__dict__, "python_fallback": "python3"})
    points = tuple(sweep / f"20260101-000000-p{i:03d}" for i in range(3))
    folder = sweep / "arrays" / "20260101-000000-nodes1"
    return ArrayPlan(first, points, folder, "sweep-mbs", throttle=2, dependency="afterok:1000,afterany:1001")


def case_id(case: tuple[str, str, int]) -> str:
    system, job, nexp = case
    return f"{system}.{job}" + (f".nexp{nexp}" if nexp > 1 else "")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_rendered_script_matches_golden(case: tuple[str, str, int], update_golden: bool) -> None:
    text = render_case(*case)
    golden = GOLDEN / f"{case_id(case)}.sh"
    if update_golden:
        golden.write_text(text)
    assert golden.is_file(), f"{golden} missing: run pytest tests/unit/launch/test_golden.py --update-golden"
    assert text == golden.read_text(), f"{golden.name} differs: review, then regenerate with --update-golden"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_rendered_script_passes_bash_and_shellcheck(case: tuple[str, str, int], tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(render_case(*case))
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (tools/dev.sh test installs it as root)")
    result = subprocess.run(["shellcheck", "--severity=style", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_every_golden_file_belongs_to_a_case() -> None:
    expected = {f"{case_id(case)}.sh" for case in CASES}
    assert {p.name for p in GOLDEN.glob("*.sh")} == expected


def test_every_module_a_job_script_runs_is_an_entry_under_jobs() -> None:
    """Each `python -m` module a rendered script names (launch/plan.py names them) is an entry point of
    flux_cluster/jobs/, the rank side, and exists: the compliance step and the signal relay included."""
    import importlib.util
    import re

    named = set()
    for case in CASES:
        named |= set(re.findall(r"-m (flux_cluster\.[\w.]+)", render_case(*case)))
    assert {"flux_cluster.jobs.compliance", "flux_cluster.jobs.signals", "flux_cluster.jobs.train"} <= named
    for module in sorted(named):
        assert module.startswith("flux_cluster.jobs.") and importlib.util.find_spec(module), module


def test_nvidia_script_has_what_run_sub_users_rely_on() -> None:
    text = render_case("dgx_h100x8", "train", 10)
    for needle in (
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "--container-image=",
        "--container-mounts=",
        "--container-workdir=/workspace/flux-cluster",
        "--no-container-mount-home",
        "--container-env=",
        "--container-name=",
        "--signal=USR1@300",
        "vm.drop_caches=3",
        "--comm-only",
        "flux_cluster.jobs.compliance --ruleset",
        "SEED_BASE=1234",
        "NEXP=10",
        "#SBATCH --export=ALL,HF_TOKEN=",  # the secret's value never passes through Slurm
        "for ((_fc_exp = 0; _fc_exp < 10; _fc_exp++))",  # a literal, never a variable, in arithmetic
    ):
        assert needle in text, needle
    # NVIDIA's WALLTIME = 5 + NEXP * (WALLTIME_RUNANDTIME + 5) with run_minutes 720: 7255 min
    assert "#SBATCH --time=120:55:00" in text
    assert "#SBATCH --array" not in text


def test_amd_script_runs_one_container_per_node() -> None:
    text = render_case("mi300x8", "train", 10)
    for needle in (
        "--device=/dev/kfd",
        "--device=/dev/dri",
        "--ipc=host",
        "--network=host",
        "#SBATCH --array=0-9",
        "_fc_runtime=docker",
        '"$_fc_runtime" run --detach',
        'exec "${_fc_exec_env[@]}"',
        "--env=HF_TOKEN",
        "#SBATCH --export=ALL,HF_TOKEN=",
        "--signal=B:USR1@300",
        "trap relay_signal USR1",
    ):
        assert needle in text, needle
    # One repeat per array task: 5 + 1 * (900 + 5) minutes.
    assert "#SBATCH --time=15:10:00" in text


def test_data_convert_job_is_an_array_with_writable_mounts() -> None:
    text = render_case("dgx_h100x8", "data-convert", 1)
    for needle in (
        "#SBATCH --array=0-7",
        "#SBATCH --dependency=afterok:1000",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --no-requeue",
        '-m flux_cluster.jobs.data --config "$_fc_config" --stage convert',
        "/lustre/mlperf/flux1/energon:/data,/lustre/mlperf/flux1/download:/source,",
    ):
        assert needle in text, needle
    for absent in ("--gpus-per-node", "jobs.compliance", "--comm-only", "drop_caches", "--exclusive"):
        assert absent not in text, absent


@pytest.mark.parametrize("script", ["tools/dev.sh", ".ci/run", "slurm/local-cluster.sh"])
def test_repository_shell_scripts_pass_shellcheck(script: str) -> None:
    path = Path(__file__).resolve().parents[3] / script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (tools/dev.sh test installs it as root)")
    result = subprocess.run(["shellcheck", "--severity=style", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_a_sweep_array_runs_each_points_own_script_in_one_allocation() -> None:
    """The job's own #SBATCH lines (but its output files, the array's), the throttle and the dependency,
    then task i runs point i's job.sh; executed with a stand-in job.sh per point, task 2 runs point 2's."""
    text = render_case("dgx_h100x8", "sweep-array", 1)
    job = render_case("dgx_h100x8", "throughput", 1)
    header = [line for line in job.splitlines() if line.startswith("#SBATCH")]
    own = [line for line in header if line.startswith(("#SBATCH --output", "#SBATCH --error"))]
    for line in header:
        assert (line in text) == (line not in own), line
    for needle in (
        "#SBATCH --array=0-2%2\n",
        "#SBATCH --dependency=afterok:1000,afterany:1001\n",
        "#SBATCH --output=/runs/sweep-mbs/arrays/20260101-000000-nodes1/slurm/%A_%a_0_log.out\n",
        'exec bash "$_fc_point/job.sh"',
    ):
        assert needle in text, needle


def test_a_sweep_array_task_runs_its_point(tmp_path: Path) -> None:
    config = load_system("local_slurm", ["paths.data_root=null"], environ={}).config
    plan = sweep_array(config)
    points = tuple(tmp_path / f"p{i}" for i in range(3))
    for point in points:
        point.mkdir()
        (point / "job.sh").write_text(f"echo ran {point.name} in task $SLURM_ARRAY_TASK_ID\n")
    script = tmp_path / "array.sh"
    script.write_text(render_array(type(plan)(**{**plan.__dict__, "run_dirs": points})))
    for task, expected in (("2", 0), ("3", 1), ("$(touch x)", 1)):
        env = {"PATH": "/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": task}
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == expected, done.stderr
        if expected == 0:
            assert done.stdout.endswith("ran p2 in task 2\n"), done.stdout
    assert not (tmp_path / "x").exists()


def test_data_download_job_gets_its_own_walltime() -> None:
    from flux_cluster.launch.data_jobs import data_job_system

    config = load_system("dgx_h100x8", [], environ={}).config
    assert data_job_system(config, "download").slurm.walltime == "24:00:00"
    assert data_job_system(config, "convert").slurm.walltime == "04:00:00"
    assert data_job_system(config, "convert").slurm.mem is None  # not the whole node, as training asks
    assert config.slurm.mem == "0"
