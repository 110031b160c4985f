"""No config value can inject a command: rendered scripts are executed by bash with recording
stand-ins for the cluster tools on PATH, and hostile values must arrive verbatim and run nothing."""

import os
import shlex
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import stand_ins
from cli_errors import error_line
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.config import SystemConfig, load_system
from flux_cluster.config.reserved import (
    BASH_VARIABLES,
    RANK_VARIABLES,
    RUN_SUB_SETTINGS,
    env_name_problem,
    script_names,
)
from flux_cluster.config.secrets import secrets_dir, store_secrets
from flux_cluster.errors import FluxClusterError

# What Python's str.splitlines() splits at: a validator that lets one through splits an #SBATCH line.
LINE_BREAKS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
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
    "PATH[$(touch {s})]",  # run by bash where the value is read in an arithmetic context (PATH is set)
    *LINE_BREAKS,
]
payloads = (
    st.lists(
        st.one_of(
            st.sampled_from(FRAGMENTS),
            st.text(alphabet="abc XYZ-_/.:=$'\"`;\\\n\t|&<>()[]" + "".join(LINE_BREAKS), max_size=6),
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


def run_rendered(
    config: SystemConfig,
    sandbox: Path,
    probe_var: str = "",
    secrets: dict[str, str] | None = None,
    must_succeed: bool = True,
) -> tuple[list[dict], Path]:
    case = sandbox / f"case{len(list(sandbox.glob('case*')))}"
    case.mkdir()
    script = stand_ins.render_case(config, case)
    if secrets:  # where submission writes them: the script runs with HOME=case (stand_ins.start)
        store_secrets(secrets, {**secrets, "HOME": str(case)})
    # The sentinel path is relative: a payload that ran 'touch' would create it in the case directory.
    code, output = stand_ins.run(script, sandbox / "bin", probe_var=probe_var)
    assert code == 0 or not must_succeed, output
    assert not (case / "PWNED").exists(), f"injected command ran; script:\n{script.read_text()}"
    return stand_ins.calls(case), case


@cache
def _resolved(system: str) -> SystemConfig:
    return load_system(system, environ={}).config


def with_payload(system: str, **updates: Any) -> SystemConfig | None:
    data = _resolved(system).model_dump()
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


# Names the job scripts have used (before their own variables moved to _fc_), those they use now (read
# from the templates), bash's and run.sub's: each must be refused, or reach the ranks as a plain variable.
HISTORIC_SCRIPT_NAMES = ["NEXP", "SEED_BASE", "RUN_DIR", "CONFIG", "RESULTS_DIR", "HEAD_NODE", "RUNTIME"]
HISTORIC_SCRIPT_NAMES += ["CONTAINER_NAME", "CONTAINER_IMAGE", "EXEC_ENV", "status", "exp", "rc", "pid"]
KNOWN_NAMES = sorted({*HISTORIC_SCRIPT_NAMES, *script_names(), *BASH_VARIABLES, *RUN_SUB_SETTINGS})
# The harness's own variables (the stand-ins are Python scripts found through PATH), not the script's.
HARNESS = {"PATH", "RECORD_FILE", "PROBE_VAR_NAME", "STAND_IN_RULES"}
env_names = st.one_of(
    st.sampled_from(KNOWN_NAMES), st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,7}", fullmatch=True)
)


@SETTINGS
@given(st.sampled_from(["local_slurm", "dgx_h100x8", "mi300x8"]), env_names, payloads)
def test_env_names_and_values_reach_the_ranks_verbatim(
    sandbox: Path, system: str, name: str, raw: str
) -> None:
    assume(name not in HARNESS and not name.startswith(("PYTHON", "LD_")))
    value = fill(raw)
    config = with_payload(system, env={name: value}, python=value)
    if config is None:  # refused: only a name the script, bash or run.sub owns
        assert env_name_problem(name) is not None, name
        config = with_payload(system, env={"PROBE": value}, python=value)
        name = "PROBE"
    assert config is not None
    calls, _ = run_rendered(config, sandbox, probe_var=name)
    rank_calls = [c for c in calls if c["argv"][0] == "srun" and "--kill-on-bad-exit=1" in c["argv"]]
    assert rank_calls and all(c["probe"] == value for c in rank_calls)
    assert all(value in c["argv"] for c in rank_calls)  # python, one argument


@pytest.mark.parametrize(
    "name", sorted({*script_names(), *BASH_VARIABLES, *RANK_VARIABLES, *RUN_SUB_SETTINGS})
)
def test_every_reserved_name_is_refused_in_one_line(name: str) -> None:
    with pytest.raises(FluxClusterError) as error:
        load_system("local_slurm", [f"env.{name}=x"])
    message = str(error.value)
    assert "\n" not in message and f"env.{name}: " in message and "cannot come from the config" in message
    assert with_payload("local_slurm", secrets=[name]) is None


def test_the_reserved_names_come_from_the_templates() -> None:
    names = script_names()
    # What the ranks read, and variables of every launcher branch (pyxis, docker, bare metal, local).
    for expected in ("MASTER_PORT", "FLUX_SEED", "_fc_run_dir", "_fc_exp", "_fc_pyxis_args", "_fc_runtime"):
        assert expected in names
    # PATH and LD_LIBRARY_PATH: only from paths.extra_path / paths.extra_library_path
    allowed = ("HOME", "IFS", "PATH", "LD_LIBRARY_PATH")
    # what a docker/podman container sees of the node's GPUs: Slurm's step, never the config, decides
    allowed += ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
    assert all(n.startswith(("_fc_", "FLUX_", "SLURM_", "MASTER_")) or n in allowed for n in names)
    assert env_name_problem("NCCL_DEBUG") is None and env_name_problem("HF_HOME") is None


@pytest.mark.parametrize("system", ["local_slurm", "dgx_h100x8", "mi300x8"])
def test_no_script_variable_is_read_as_code_even_if_validation_let_it_through(
    sandbox: Path, system: str
) -> None:
    """Defence in depth: with the name check bypassed, a hostile value under any name the script uses
    still runs nothing: no config value is read back in an arithmetic context."""
    # IFS, PATH, LD_LIBRARY_PATH would stop the stand-ins being found at all (the validator refuses them)
    names = sorted({*script_names(), *HISTORIC_SCRIPT_NAMES} - {"IFS", "PATH", "LD_LIBRARY_PATH"})
    from_slurm = {"SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID"}  # checked as digits: the script stops there
    base = _resolved(system)
    for batch in ([n for n in names if n not in from_slurm], sorted(from_slurm)):
        hostile = base.model_copy(update={"env": dict.fromkeys(batch, fill("PATH[$(touch {s})]"))})
        calls, _ = run_rendered(hostile, sandbox, must_succeed=False)
        if batch != sorted(from_slurm):
            assert any("--kill-on-bad-exit=1" in c["argv"] for c in calls), "the ranks never started"


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


@pytest.mark.parametrize("system", ["dgx_h100x8", "mi300x8", "local_slurm"])
def test_secrets_reach_the_ranks_from_a_private_file_not_through_slurm(sandbox: Path, system: str) -> None:
    secret = fill("hf_4f3a $(touch {s}) 'q' \\ PATH[$(touch {s})]\n")
    config = with_payload(system, secrets=["HF_TOKEN"])
    assert config is not None
    calls, case = run_rendered(config, sandbox, probe_var="HF_TOKEN", secrets={"HF_TOKEN": secret})
    text = (case / "job.sh").read_text()
    # sbatch keeps the submitting environment in slurmctld's state: the secret is blanked there.
    assert "#SBATCH --export=ALL,HF_TOKEN=\n" in text and "hf_4f3a" not in text
    rank_calls = [c for c in calls if c["argv"][0] == "srun" and "--kill-on-bad-exit=1" in c["argv"]]
    assert rank_calls and all(c["probe"] == secret for c in rank_calls)  # verbatim, newline included
    folder = secrets_dir({"HOME": str(case)})
    assert (folder / "HF_TOKEN").stat().st_mode & 0o777 == 0o600 and folder.stat().st_mode & 0o777 == 0o700


@pytest.mark.slurm
def test_slurm_saves_no_secret_value_in_the_job_environment(
    slurm_cluster: dict[str, str], cli: CliRunner, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held job (nothing runs): what slurmctld stored as the job's environment holds no secret."""
    secret = "hf_never_in_slurm_state_73d1"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("FLUX_CLUSTER_SECRETS", str(workdir / "secrets"))
    args = [
        "submit",
        "--system",
        "local_slurm",
        "--job",
        "preflight",
        "--dry-run",
        "--set",
        "secrets=[HF_TOKEN]",
    ]
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (workdir / "secrets" / "HF_TOKEN").read_text() == secret
    script = next(workdir.glob("runs/*/*/job.sh"))
    submitted = subprocess.run(
        ["sbatch", "--hold", "--parsable", str(script)], capture_output=True, text=True
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
        state = next(
            line.split("=", 1)[1].strip() for line in config.splitlines() if "StateSaveLocation" in line
        )
        saved = (Path(state) / f"hash.{int(job_id) % 10}" / f"job.{job_id}" / "environment").read_bytes()
        assert b"HF_TOKEN=\0" in saved and secret.encode() not in saved
        details = subprocess.run(["scontrol", "show", "job", "-dd", job_id], capture_output=True).stdout
        assert secret.encode() not in details
    finally:
        subprocess.run(["scancel", job_id], check=False)


CHECKED_FIELDS = [
    ("slurm.walltime", "90"),
    ("data_prep.walltime", "1-00:00:00"),
    ("slurm.partition", "batch"),
    ("slurm.account", "mlperf"),
    ("slurm.qos", "high"),
    ("slurm.mem_per_cpu", "1000"),
    ("name", "site"),
    ("container.name", "fc"),
    ("container.registry", "registry.example.com/mlperf"),
    ("slurm.extra_sbatch", ["--reservation=x"]),
    ("slurm.srun_args", ["--mpi=pmix"]),
    ("secrets", ["HF_TOKEN"]),
    ("env", {"NCCL_DEBUG": "INFO"}),
]


def test_a_line_break_never_passes_a_check() -> None:
    """Python's re '$' also matches before a final newline: every check must match the whole value. All
    fields x all line breaks x both ends (a few hundred validations, no script runs)."""

    def broken(valid: Any, line_break: str, at_end: bool) -> Any:
        if isinstance(valid, list):
            return [broken(valid[0], line_break, at_end)]
        if isinstance(valid, dict):
            return {broken(k, line_break, at_end): v for k, v in valid.items()}
        return valid + line_break if at_end else line_break + valid

    for key, valid in CHECKED_FIELDS:
        assert with_payload("local_slurm", **{key: valid}) is not None, key
        for line_break in LINE_BREAKS:
            for at_end in (True, False):
                bad = broken(valid, line_break, at_end)
                assert with_payload("local_slurm", **{key: bad}) is None, f"{key}={bad!r} was accepted"


def test_a_yaml_escaped_newline_is_refused_with_one_line() -> None:
    with pytest.raises(FluxClusterError, match=r"^--set: slurm.walltime: expected minutes") as error:
        load_system("local_slurm", [r'slurm.walltime="90\n"'])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("option", "value"), [("--experiment", "pf\n"), ("--experiment", "pf\u2028"), ("--runs-dir", "r\n")]
)
def test_cli_names_ending_in_a_line_break_are_refused(
    cli: CliRunner, workdir: Path, option: str, value: str
) -> None:
    if option == "--runs-dir":
        value = str(workdir / value)
    line = error_line(cli.invoke(app, ["submit", "--system", "local_slurm", "--dry-run", option, value]))
    assert option in line or "Slurm jobs need paths" in line
    assert not any(workdir.iterdir()), "nothing is created"


# ---- names that act on the batch shell or the programs it starts (issue 27)

# The bash manual, "Shell Variables" (Bourne shell and Bash variables), less LANG, LC_* and TMPDIR.
BASH_MANUAL = """CDPATH HOME IFS MAIL MAILPATH OPTARG OPTIND PATH PS1 PS2 _ BASH BASHOPTS BASHPID BASH_ALIASES
BASH_ARGC BASH_ARGV BASH_ARGV0 BASH_CMDS BASH_COMMAND BASH_COMPAT BASH_ENV BASH_EXECUTION_STRING BASH_LINENO
BASH_LOADABLES_PATH BASH_MONOSECONDS BASH_REMATCH BASH_SOURCE BASH_SUBSHELL BASH_TRAPSIG BASH_VERSINFO
BASH_VERSION BASH_XTRACEFD CHILD_MAX COLUMNS COMP_CWORD COMP_KEY COMP_LINE COMP_POINT COMP_TYPE
COMP_WORDBREAKS COMP_WORDS COMPREPLY COPROC DIRSTACK EMACS ENV EPOCHREALTIME EPOCHSECONDS EUID EXECIGNORE
FCEDIT FIGNORE FUNCNAME FUNCNEST GLOBIGNORE GLOBSORT GROUPS histchars HISTCMD HISTCONTROL HISTFILE
HISTFILESIZE HISTIGNORE HISTSIZE HISTTIMEFORMAT HOSTFILE HOSTNAME HOSTTYPE IGNOREEOF INPUTRC INSIDE_EMACS
LINENO LINES MACHTYPE MAILCHECK MAPFILE OLDPWD OPTERR OSTYPE PIPESTATUS POSIXLY_CORRECT PPID PROMPT_COMMAND
PROMPT_DIRTRIM PS0 PS3 PS4 PWD RANDOM READLINE_ARGUMENT READLINE_LINE READLINE_MARK READLINE_POINT REPLY
SECONDS SHELL SHELLOPTS SHLVL SRANDOM TIMEFORMAT TMOUT UID""".split()  # noqa: SIM905
LOADER_AND_GLIBC = """LD_PRELOAD LD_LIBRARY_PATH LD_AUDIT LD_BIND_NOW GCONV_PATH GLIBC_TUNABLES MALLOC_TRACE
LOCPATH NLSPATH HOSTALIASES RES_OPTIONS TZDIR LOCALDOMAIN""".split()  # noqa: SIM905
LAUNCHER = ["SRUN_CPUS_PER_TASK", "SBATCH_EXPORT", "SALLOC_PARTITION", "SLURM_EXPORT_ENV"]
shell_acting_names = st.one_of(
    st.sampled_from(BASH_MANUAL + LOADER_AND_GLIBC + LAUNCHER),
    st.from_regex(r"(LD_|BASH_|SRUN_|SBATCH_)[A-Z0-9_]{0,6}", fullmatch=True),
)


@settings(max_examples=30, deadline=None)
@given(shell_acting_names)
def test_names_that_act_on_the_batch_shell_are_refused_everywhere(name: str) -> None:
    """--set, a config file and the API (SystemConfig) share one check: one line naming the key and why."""
    with pytest.raises(FluxClusterError) as error:
        load_system("local_slurm", [f"env.{name}=/x"], environ={})
    message = str(error.value)
    assert "\n" not in message and f"env.{name}: " in message and "cannot come from the config" in message
    assert with_payload("local_slurm", env={name: "/x"}) is None
    assert with_payload("local_slurm", secrets=[name]) is None


def test_a_site_file_and_a_sweep_grid_refuse_them_too(cli: CliRunner, workdir: Path) -> None:
    (workdir / "site.yaml").write_text("extends: local_slurm\nenv:\n  LD_PRELOAD: /tmp/evil.so\n")
    line = error_line(cli.invoke(app, ["systems", "show", "site.yaml"]))
    assert "site.yaml: env.LD_PRELOAD: " in line and "dynamic loader" in line
    grid = ["sweep", "--system", "local_slurm", "--grid", "env.FUNCNEST=1,2", "--synthetic", "--dry-run"]
    assert "env.FUNCNEST: FUNCNEST is read or set by bash itself" in error_line(cli.invoke(app, grid))


@pytest.mark.parametrize(
    "name", ["LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "NCCL_DEBUG", "PYTHONHASHSEED", "MALLOC_ARENA_MAX"]
)
def test_harmless_locale_and_tool_names_stay_allowed(name: str) -> None:
    assert env_name_problem(name) is None


def test_extra_path_entries_are_prepended_quoted(sandbox: Path) -> None:
    dirs = ["/opt/site tools/bin", "/opt/$(touch PWNED)"]
    config = with_payload("local_slurm", **{"paths.extra_path": dirs, "paths.extra_library_path": dirs[:1]})
    assert config is not None
    calls, _ = run_rendered(config, sandbox, probe_var="PATH")
    ranks = [c for c in calls if "--kill-on-bad-exit=1" in c["argv"]]
    assert ranks and all(c["probe"].startswith(":".join(dirs) + ":") for c in ranks)
    calls, _ = run_rendered(config, sandbox, probe_var="LD_LIBRARY_PATH")
    assert {c["probe"] for c in calls if "--kill-on-bad-exit=1" in c["argv"]} == {dirs[0]}
    for bad in (["relative/bin"], ["/a:/b"], ["/a\x1b"]):
        assert with_payload("local_slurm", **{"paths.extra_path": bad}) is None, bad


# ---- raw control characters never reach the script text (issue 27)


@pytest.mark.parametrize("system", ["local_slurm", "local"])
def test_control_characters_in_values_are_escaped_in_the_script(
    cli: CliRunner, workdir: Path, sandbox: Path, system: str
) -> None:
    value = "a\x1b[2Jb\x07c\u202ed\x85e'f\\g\n"
    result = cli.invoke(app, ["submit", "--system", system, "--dry-run", "--set", f"env.HOSTILE={value}"])
    assert result.exit_code == 0, result.output
    assert "export HOSTILE=$'a\\x1b[2Jb\\x07c" in result.stdout
    assert not any(c in result.output for c in "\x1b\x07\u202e\x85")
    if system == "local_slurm":  # bash still gets the exact value
        config = with_payload(system, env={"HOSTILE": value})
        assert config is not None
        calls, _ = run_rendered(config, sandbox, probe_var="HOSTILE")
        assert {c["probe"] for c in calls if "--kill-on-bad-exit=1" in c["argv"]} == {value}


def test_a_nul_in_an_env_value_is_one_line() -> None:
    with pytest.raises(FluxClusterError, match=r"env.X: a NUL character") as error:
        load_system("local_slurm", ["env.X=a\x00b"], environ={})
    assert "\n" not in str(error.value)


# ---- ids from a run folder never become Slurm options (issue 27)

TOOL_RECORDER = """#!/bin/bash
printf '%s\\n' "$(basename "$0") $*" >> "$FC_TOOL_RECORD"
"""
option_shaped_ids = st.one_of(
    st.sampled_from(["--me", "--user=root", "--partition=debug", "-u", "--", "-1", "1 2", "1;id", "../x"]),
    st.sampled_from(["12\n", "\u0661\u0662", "1_", "1_[", "12_[0-3]; id", "\x1b[2J", "", "+1"]),
    st.from_regex(r"-{1,2}[a-z][a-z-]{0,8}(=[a-z0-9]{0,4})?", fullmatch=True),
)


@pytest.fixture
def slurm_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Recording scancel/scontrol/sacct on PATH; returns the file their calls are written to."""
    bin_dir = tmp_path / "tools"
    bin_dir.mkdir()
    for tool in ("scancel", "scontrol", "sacct", "squeue", "sbatch"):
        (bin_dir / tool).write_text(TOOL_RECORDER)
        (bin_dir / tool).chmod(0o755)
    record = tmp_path / "tool-calls.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FC_TOOL_RECORD", str(record))
    return record


def _slurm_run(root: Path, job_ids: list[Any]) -> Path:
    import json

    from flux_cluster.rundir import write_run_config

    run_dir = root / "runs" / "train" / "20260101-000000-local_slurm"
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_config(run_dir, _resolved("local_slurm"), {"name": "train"})
    (run_dir / "jobs.json").write_text(
        json.dumps({"launcher": "slurm", "job_ids": job_ids, "submitted_at": 1.0})
    )
    return run_dir


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option_shaped_ids)
def test_job_ids_from_jobs_json_never_reach_a_slurm_tool(
    cli: CliRunner, workdir: Path, slurm_tools: Path, job_id: str
) -> None:
    from flux_cluster.launch import slurm

    run_dir = _slurm_run(workdir, ["123", job_id])
    for command in (["cancel", str(run_dir)], ["runs", "requeue", str(run_dir)], ["status", str(run_dir)]):
        line = error_line(cli.invoke(app, command))
        assert "jobs.json: job_ids: expected a list of Slurm job ids" in line
        assert not any(c in line for c in "\x1b\n")
    for call in (slurm.cancel, slurm.requeue, slurm.job_states):
        with pytest.raises(FluxClusterError, match="is not a Slurm job id"):
            call(["123", job_id], *([run_dir] if call is slurm.cancel else []))
    with pytest.raises(FluxClusterError, match="is not a Slurm job id"):
        slurm.job_info(job_id)
    assert not slurm_tools.exists(), slurm_tools.read_text()


def test_checked_job_ids_reach_scancel_and_scontrol_after_a_double_dash(
    cli: CliRunner, workdir: Path, slurm_tools: Path
) -> None:
    run_dir = _slurm_run(workdir, ["123", "124_7", "125_[0-3%2]", "126+1"])
    assert cli.invoke(app, ["cancel", str(run_dir)]).exit_code == 0
    assert cli.invoke(app, ["runs", "requeue", str(run_dir)]).exit_code == 0
    calls = slurm_tools.read_text().splitlines()
    assert calls[:2] == ["scancel -- 123", "scancel -- 124_7"]
    assert "scontrol -- requeue 126+1" in calls


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
        ('{"launcher": "slurm", "job_ids": [], "submitted_at": ' + "9" * 5000 + "}", "not valid JSON"),
        ('{"launcher": "local", "job_ids": [], "submitted_at": 1, "pid": "self"}', "pid: expected null or a"),
        ('{"launcher": "local", "job_ids": [], "submitted_at": 1, "pid": 1}', "pid: expected null or a"),
        ('{"launcher": "local", "job_ids": [], "submitted_at": 1, "pid": true}', "pid: expected null or a"),
        ('{"launcher": "local", "job_ids": "123", "submitted_at": 1}', "job_ids: expected a list"),
        ('{"launcher": "rsh", "job_ids": [], "submitted_at": 1}', "launcher: expected one of"),
        ('{"launcher": "local", "job_ids": []}', "submitted_at: missing"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_a_damaged_jobs_json_is_one_line_and_runs_list_goes_on(
    cli: CliRunner, workdir: Path, content: str, expected: str
) -> None:
    good = _slurm_run(workdir, [])
    (good / "jobs.json").write_text('{"launcher": "dry-run", "job_ids": [], "submitted_at": 1}')
    bad = workdir / "runs" / "train" / "20260102-000000-local"
    bad.mkdir()
    (bad / "config.yaml").write_text((good / "config.yaml").read_text())
    (bad / "jobs.json").write_text(content)
    for command in (["cancel", str(bad)], ["status", str(bad)], ["logs", str(bad)]):
        line = error_line(cli.invoke(app, command))
        assert "jobs.json: " in line and expected in line, line
    listing = cli.invoke(app, ["runs", "list"], env={"COLUMNS": "400"})
    assert listing.exit_code == 0 and "Traceback" not in listing.output, listing.output
    assert "train/20260101-000000-local_slurm" in listing.stdout and "NOT SUBMITTED" in listing.stdout
    (skipped,) = listing.stderr.splitlines()
    assert skipped.startswith("skipped train/20260102-000000-local: ") and expected in skipped
