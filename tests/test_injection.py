"""No config value can inject a command: rendered scripts are executed by bash with recording
stand-ins for the cluster tools on PATH, and hostile values must arrive verbatim and run nothing."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flux_cluster.config import SystemConfig, load_system
from flux_cluster.plan import make_plan
from flux_cluster.render import render_script

# Each stand-in writes its argv (JSON) and a chosen variable's value, then succeeds.
RECORDER = """#!{python}
import json, os, sys
with open(os.environ["RECORD_FILE"], "a") as out:
    out.write(json.dumps({"argv": [os.path.basename(sys.argv[0])] + sys.argv[1:],
                          "probe": os.environ.get(os.environ.get("PROBE_VAR_NAME") or "-")}) + "\\n")
"""
TOOLS = ["srun", "scontrol", "sinfo", "docker", "podman", "python3", "sudo"]

FRAGMENTS = [
    "$(touch {s})",
    "`touch {s}`",
    "; touch {s}",
    "\ntouch {s}\n",
    "' ; touch {s} ; '",
    '" ; touch {s} ; "',
    "${IFS}",
    "$((1+1))",
    "*",
    "\\",
    "|| touch {s}",
    "&& touch {s}",
    "> {s}",
    "#",
    "!",
    "~",
    "{a,b}",
]
payloads = (
    st.lists(
        st.one_of(
            st.sampled_from(FRAGMENTS), st.text(alphabet="abc XYZ-_/.:=$'\"`;\\\n\t|&<>()", max_size=6)
        ),
        min_size=1,
        max_size=5,
    )
    .map("".join)
    .filter(lambda text: text.strip() != "")
)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sandbox")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        path = bin_dir / tool
        path.write_text(RECORDER.replace("{python}", sys.executable))  # not via PATH: python3 is a stand-in
        path.chmod(0o755)
    return root


def run_rendered(
    config: SystemConfig, sandbox: Path, probe_var: str | None = None
) -> tuple[list[dict], Path]:
    case = sandbox / f"case{len(list(sandbox.glob('case*')))}"
    case.mkdir()
    plan = make_plan(config, "train", case / "run", "x", 7)
    plan = type(plan)(**{**plan.__dict__, "python_fallback": "python3"})
    script = case / "job.sh"
    script.write_text(render_script(plan))
    record = case / "record.jsonl"
    env = {
        "PATH": f"{sandbox / 'bin'}:/usr/bin:/bin",
        "RECORD_FILE": str(record),
        "HOME": str(case),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_ARRAY_TASK_ID": "0",
        "PROBE_VAR_NAME": probe_var or "",
    }
    # The sentinel path is relative: a payload that ran 'touch' would create it in the case directory.
    result = subprocess.run(
        ["bash", str(script)], cwd=case, env=env, capture_output=True, text=True, timeout=20
    )
    assert result.returncode == 0, result.stderr
    assert not (case / "PWNED").exists(), f"injected command ran; script:\n{script.read_text()}"
    calls = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return calls, case


def with_payload(system: str, **updates: Any) -> SystemConfig | None:
    data = load_system(system, environ={}).config.model_dump()
    for dotted, value in updates.items():
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    try:
        return SystemConfig.model_validate(data)
    except ValueError:
        return None  # rejected at validation: also safe


def fill(template: str) -> str:
    return template.replace("{s}", "PWNED")


SETTINGS = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(payloads)
def test_env_values_reach_the_ranks_verbatim(sandbox: Path, raw: str) -> None:
    value = fill(raw)
    config = with_payload("local_slurm", env={"PROBE": value})
    assert config is not None
    calls, _ = run_rendered(config, sandbox, probe_var="PROBE")
    rank_calls = [c for c in calls if c["argv"][0] == "srun" and "--kill-on-bad-exit=1" in c["argv"]]
    assert rank_calls and all(c["probe"] == value for c in rank_calls)


@SETTINGS
@given(payloads)
def test_pyxis_image_workdir_and_mounts_are_single_arguments(sandbox: Path, raw: str) -> None:
    value = fill(raw)
    config = with_payload(
        "dgx_h100x8",
        **{
            "container.image": value,
            "container.workdir": value,
            "paths.data_root": f"/d{value}",
            "mlperf.clear_caches": False,
        },
    )
    if config is None:  # a data root that would split the mount list is rejected by validation
        assert any(c in value for c in ",:\n")
        return
    calls, _ = run_rendered(config, sandbox)
    argv = [arg for c in calls for arg in c["argv"]]
    assert f"--container-image={value}" in argv
    assert f"--container-workdir={value}" in argv
    assert any(arg.startswith(f"--container-mounts=/d{value}:/data:ro,") for arg in argv)


@SETTINGS
@given(payloads)
def test_docker_run_args_and_mounts_are_single_arguments(sandbox: Path, raw: str) -> None:
    value = fill(raw)
    config = with_payload(
        "mi300x8",
        **{
            "container.run_args": [value],
            "container.mounts": [f"/src{value}:/dst"],
            "container.image": value,
        },
    )
    calls, _ = run_rendered(config, sandbox) if config else ([], None)
    if config is None:  # mounts with ',' or a second ':' are rejected by validation
        assert "," in value or ":" in value or "\n" in value
        return
    docker_run = next(c["argv"] for c in calls if "run" in c["argv"] and "--detach" in c["argv"])
    assert value in docker_run and f"--volume=/src{value}:/dst" in docker_run
    assert docker_run[docker_run.index("sleep") - 1] == value  # the image


@SETTINGS
@given(payloads)
def test_sbatch_header_values_are_rejected_unless_plain(raw: str) -> None:
    value = fill(raw)
    for key in ("slurm.partition", "slurm.account", "slurm.qos", "name", "container.name"):
        config = with_payload("local_slurm", **{key: value})
        if config is not None:
            assert shlex.quote(value) == value and "\n" not in value


def test_secrets_are_passed_by_name_only(sandbox: Path) -> None:
    config = with_payload("dgx_h100x8", secrets=["HF_TOKEN"])
    assert config is not None
    secret = "hf_do_not_leak_4f3a"
    os.environ["HF_TOKEN"] = secret
    try:
        calls, case = run_rendered(config, sandbox, probe_var="HF_TOKEN")
    finally:
        del os.environ["HF_TOKEN"]
    text = (case / "job.sh").read_text()
    assert "HF_TOKEN" in text and secret not in text
    assert any("--container-env=" in a and "HF_TOKEN" in a for c in calls for a in c["argv"])
