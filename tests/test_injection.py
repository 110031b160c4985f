"""No config value can inject a command: rendered scripts are executed by bash with recording
stand-ins for the cluster tools on PATH, and hostile values must arrive verbatim and run nothing."""

import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import stand_ins
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flux_cluster.config import SystemConfig, load_system

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
    stand_ins.install(root / "bin")
    return root


def run_rendered(config: SystemConfig, sandbox: Path, probe_var: str = "") -> tuple[list[dict], Path]:
    case = sandbox / f"case{len(list(sandbox.glob('case*')))}"
    case.mkdir()
    script = stand_ins.render_case(config, case)
    # The sentinel path is relative: a payload that ran 'touch' would create it in the case directory.
    code, output = stand_ins.run(script, sandbox / "bin", probe_var=probe_var)
    assert code == 0, output
    assert not (case / "PWNED").exists(), f"injected command ran; script:\n{script.read_text()}"
    return stand_ins.calls(case), case


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
    config = with_payload("local_slurm", env={"PROBE": value}, python=value)
    assert config is not None
    calls, _ = run_rendered(config, sandbox, probe_var="PROBE")
    rank_calls = [c for c in calls if c["argv"][0] == "srun" and "--kill-on-bad-exit=1" in c["argv"]]
    assert rank_calls and all(c["probe"] == value for c in rank_calls)
    assert all(c["argv"][c["argv"].index("--kill-on-bad-exit=1") + 1] == value for c in rank_calls)  # python


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
            "paths.data_mount": f"/m{value}",
            "mlperf.clear_caches": False,
        },
    )
    if config is None:  # a path that would split the mount list is rejected by validation
        assert any(c in value for c in ",:\n")
        return
    calls, _ = run_rendered(config, sandbox)
    argv = [arg for c in calls for arg in c["argv"]]
    assert f"--container-image={value}" in argv
    assert f"--container-workdir={value}" in argv
    assert any(arg.startswith(f"--container-mounts=/d{value}:/m{value}:ro,") for arg in argv)


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
    if config is None:  # mounts with ',' or a second ':' are rejected by validation
        assert "," in value or ":" in value or "\n" in value
        return
    calls, _ = run_rendered(config, sandbox)
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
