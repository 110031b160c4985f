"""System configs: composition, interpolation, overrides, provenance and one-line errors."""

import os
import tracemalloc
from pathlib import Path

import pytest
import yaml

from flux_cluster.config import known_systems, load_system
from flux_cluster.config.loader import MAX_YAML_BYTES, flat_view, load_yaml_safely
from flux_cluster.errors import FluxClusterError


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLUX_CLUSTER_SYSTEMS", str(tmp_path))
    write(
        tmp_path,
        "_base",
        "vendor: nvidia\ngpu_model: H100\npeak_bf16_tflops: 989\ngpus_per_node: 8\n"
        "env: {A: '1', B: '2'}\nslurm: {partition: batch, exclusive: true}\n",
    )
    return tmp_path


def test_every_shipped_system_is_valid_and_listed(shipped_systems: tuple[str, ...]) -> None:
    assert set(shipped_systems) <= set(known_systems())
    assert not any(name.startswith("_") for name in known_systems())
    for name in shipped_systems:
        config = load_system(name).config
        assert config.name == name
    assert load_system("gb200_nvl72").config.gpus_per_node == 4
    amd = load_system("mi300x8").config
    assert amd.vendor == "amd" and amd.container.runtime in ("docker", "podman")
    assert load_system("local").config.launcher == "local"
    assert load_system("local_slurm").config.container.runtime == "none"


def test_extends_merges_leaves_and_records_sources(site: Path) -> None:
    write(site, "mine", "extends: _base\nnodes: 2\nenv: {B: '3', C: '4'}\nslurm: {partition: gpu}\n")
    resolved = load_system("mine")
    config = resolved.config
    assert config.env == {"A": "1", "B": "3", "C": "4"}
    assert config.slurm.partition == "gpu" and config.slurm.exclusive is True
    assert resolved.source_of("env.A").endswith("_base.yaml")
    assert resolved.source_of("env.B").endswith("mine.yaml")
    assert resolved.source_of("slurm.qos") == "default"
    rows = {key: source for key, _, source in flat_view(resolved)}
    assert rows["slurm.exclusive"].endswith("_base.yaml") and rows["slurm.account"] == "default"


def test_cli_overrides_win_and_are_typed(site: Path) -> None:
    write(site, "mine", "extends: _base\nnodes: 2\n")
    resolved = load_system("mine", ["nodes=4", "env.NCCL_DEBUG=INFO", "slurm.exclusive=false"])
    assert resolved.config.nodes == 4 and resolved.config.slurm.exclusive is False
    assert resolved.config.env["NCCL_DEBUG"] == "INFO"
    assert resolved.source_of("nodes") == "--set" and resolved.source_of("env.NCCL_DEBUG") == "--set"


def test_environment_interpolation(site: Path) -> None:
    write(
        site,
        "mine",
        "extends: _base\nnodes: 1\npaths: {data_root: '${DATA}/energon', log_root: '${LOGS:-/tmp/l}'}\n",
    )
    resolved = load_system("mine", environ={"DATA": "/lustre/x"})
    assert resolved.config.paths.data_root == "/lustre/x/energon"
    assert resolved.config.paths.log_root == "/tmp/l"
    assert "${DATA}" in resolved.source_of("paths.data_root")
    with pytest.raises(
        FluxClusterError, match=r"mine.yaml: paths.data_root: environment variable DATA is not set"
    ):
        load_system("mine", environ={})


def test_unknown_system_lists_the_known_ones(shipped_systems: tuple[str, ...]) -> None:
    with pytest.raises(FluxClusterError) as error:
        load_system("dgx_h100x9")
    message = str(error.value)
    assert "unknown system 'dgx_h100x9'" in message and "did you mean 'dgx_h100x8'" in message
    assert all(name in message for name in shipped_systems)


def test_unknown_key_suggests_the_nearest(site: Path) -> None:
    write(site, "mine", "extends: _base\nnodes: 1\nslurm: {partiton: x}\n")
    with pytest.raises(
        FluxClusterError, match=r"mine.yaml: slurm.partiton: unknown key; did you mean 'slurm.partition'"
    ):
        load_system("mine")
    with pytest.raises(
        FluxClusterError, match=r"--set: gpus_per_nod: unknown key; did you mean 'gpus_per_node'"
    ):
        load_system("local", ["gpus_per_nod=3"])


def test_wrong_type_names_file_key_value_and_type(site: Path) -> None:
    write(site, "mine", "extends: _base\nnodes: four\n")
    with pytest.raises(FluxClusterError) as error:
        load_system("mine")
    assert str(error.value) == (
        f"{site / 'mine.yaml'}: nodes: got 'four' (str), expected a valid integer, "
        "unable to parse string as an integer"
    )
    with pytest.raises(
        FluxClusterError, match=r"container.runtime: got 'singularity' \(str\), expected 'pyxis'"
    ):
        load_system("local_slurm", ["container.runtime=singularity"])


def test_structural_errors_are_single_lines(site: Path) -> None:
    write(site, "loop_a", "extends: loop_b\n")
    write(site, "loop_b", "extends: loop_a\n")
    write(site, "broken", "nodes: [1,\n")
    write(site, "listy", "- 1\n- 2\n")
    for name, pattern in (
        ("loop_a", "extends: cycle"),
        ("broken", "broken.yaml: line"),
        ("listy", "expected a mapping"),
        ("local", None),
    ):
        if pattern is None:
            with pytest.raises(FluxClusterError, match="expected KEY=VALUE"):
                load_system(name, ["nodes"])
            continue
        with pytest.raises(FluxClusterError, match=pattern) as error:
            load_system(name)
        assert "\n" not in str(error.value)


def test_cross_field_checks() -> None:
    with pytest.raises(FluxClusterError, match=r"container\.image is required"):
        load_system("local_slurm", ["container.runtime=pyxis"])
    with pytest.raises(FluxClusterError, match="launcher 'local' runs on this machine"):
        load_system("local", ["nodes=2"])
    with pytest.raises(FluxClusterError, match=r"slurm.extra_sbatch.0: got|slurm.extra_sbatch.0: .*match"):
        load_system("local_slurm", ["slurm.extra_sbatch=['--comment=a b']"])


def test_dollar_dollar_is_a_literal_dollar(site: Path) -> None:
    write(site, "mine", "extends: _base\nnodes: 1\nenv: {P: '$${HOME}/x', Q: 'a$$b'}\n")
    assert load_system("mine", environ={"HOME": "/root"}).config.env == {
        "A": "1",
        "B": "2",
        "P": "${HOME}/x",
        "Q": "a$b",
    }


def test_yaml_times_stay_strings_and_numbers_become_env_strings(site: Path) -> None:
    write(
        site, "mine", "extends: _base\nnodes: 1\nslurm: {walltime: 12:00:00}\nenv: {NCCL_MIN_NCHANNELS: 32}\n"
    )
    config = load_system("mine").config
    assert config.slurm.walltime == "12:00:00" and config.env["NCCL_MIN_NCHANNELS"] == "32"
    assert load_system("local_slurm", ["slurm.walltime=1-00:00:00"]).config.slurm.walltime == "1-00:00:00"
    with pytest.raises(FluxClusterError, match=r"--set: slurm.walltime: expected minutes, H:MM:SS"):
        load_system("local_slurm", ["slurm.walltime=12:00"])  # MM:SS to Slurm: refused as ambiguous


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.BASH_ENV=/tmp/x", "BASH_ENV is read or set by bash itself; it cannot come from the config"),
        ("env.NEXP=NEXP[$(touch /tmp/pwned)]", "NEXP is run.sub's name for --nexp (mlperf.nexp)"),
        ("env._fc_run_dir=/x", "_fc_run_dir is set by the job script or by Slurm"),
        ("env.SLURM_NTASKS=3", "SLURM_NTASKS is set by the job script"),
        ("secrets=[MASTER_ADDR]", "MASTER_ADDR is set by the job script"),
        ("slurm.extra_sbatch=[--output=/tmp/x]", "--output is set by flux-cluster itself"),
        ("slurm.extra_sbatch=[--export=NONE]", "--export is set by flux-cluster itself"),
        ("slurm.signal_lead_s=70000", "less than or equal to 65535"),
        ("name=a/b", "--set: name: got 'a/b'"),
    ],
)
def test_values_that_would_break_the_job_are_refused(override: str, message: str) -> None:
    with pytest.raises(FluxClusterError) as error:
        load_system("local_slurm", [override])
    assert message in str(error.value)


def test_errors_blame_the_option_that_set_the_value() -> None:
    with pytest.raises(FluxClusterError, match=r"^--nexp: mlperf.nexp: got 0 \(int\)"):
        load_system("local", [("mlperf.nexp=0", "--nexp")])
    with pytest.raises(FluxClusterError, match=r"^--set: slurm.partition: got \{'x': 5\} \(dict\)"):
        load_system("local_slurm", ["slurm.partition.x=5"])


def test_a_file_that_is_not_utf8_is_one_clean_error(site: Path) -> None:
    (site / "latin.yaml").write_bytes(b"description: caf\xe9\n")
    with pytest.raises(FluxClusterError, match=r"latin.yaml: not UTF-8 text"):
        load_system("latin")


def alias_bomb(levels: int) -> str:
    """Each level lists the previous one 9 times: a few hundred bytes that expand to 9**levels values."""
    lines = ["  L0: &L0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"  L{i}: &L{i} [{', '.join([f'*L{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "extends: _base\nnodes: 1\nenv:\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "extends: _base\nnodes:\n" + "".join(" " * i + "-\n" for i in range(2000)),
            "nested more than 64 levels",
        ),
        (alias_bomb(7), "env.L5: more than 100000 values once aliases are expanded"),
        (
            "extends: _base\nnodes: 1\nslurm:\n  partition: a\n  qos: b\n  partition: c\n",
            "line 6: slurm.partition: duplicate key (first at line 4); each key may appear once",
        ),
        ("extends: _base\nnodes: 1\nenv: &e {A: *e}\n", "line 3: env.A: an alias refers to a value that"),
        ("extends: _base\nnodes: " + "9" * 5000 + "\n", "line 2: invalid value '999"),
        ("extends: _base\nnodes: 1\ndescription: 2024-02-30\n", "line 3: invalid value '2024-02-30'"),
        ('extends: _base\nnodes: 1\ndescription: "\\udcff"\n', "description: '\\udcff' is not valid UTF-8"),
        ("#\n" * (MAX_YAML_BYTES // 2 + 1), "larger than 4 MiB; expected a config file of a few KB"),
    ],
    ids=["deep", "alias-bomb", "duplicate-key", "recursive", "huge-int", "no-such-date", "surrogate", "huge"],
)
def test_hostile_yaml_is_one_line_with_flat_memory(site: Path, text: str, expected: str) -> None:
    write(site, "mine", text)
    tracemalloc.start()
    try:
        with pytest.raises(FluxClusterError) as error:
            load_system("mine")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(error.value)
    assert message.startswith(f"{site / 'mine.yaml'}: ") and expected in message and "\n" not in message
    assert peak < 32 * 2**20, f"{peak / 2**20:.0f} MiB to refuse {len(text)} bytes"


def test_a_fifo_or_folder_is_named_as_such_and_never_blocks(site: Path) -> None:
    os.mkfifo(site / "fifo.yaml")  # nothing ever writes it: a blocking open would hang here
    (site / "folder.yaml").mkdir()
    write(site, "child", "extends: fifo\n")
    for name, expected in (
        ("fifo", "fifo.yaml: is a FIFO"),
        ("folder", "folder.yaml: is a folder"),
        ("child", "fifo.yaml: is a FIFO"),
    ):
        with pytest.raises(FluxClusterError, match=expected) as error:
            load_system(name)
        assert "unknown system" not in str(error.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("description=\udcff", "--set 'description=\\udcff': not valid UTF-8 text; expected KEY=VALUE"),
        ("env.A\udcff=1", "--set 'env.A\\udcff=1': not valid UTF-8 text"),
        ("env={A: 1, A: 2}", "--set: env: A: duplicate key (first at line 1); each key may appear once"),
        ("nodes=" + "[" * 100, "--set: nodes: nested more than 64 levels deep"),
        ('env={"A\\n": 1}', "--set: env.'A\\n': this name should match pattern"),
        (
            "env="
            + alias_bomb(7)
            .split("env:", 1)[1]
            .replace("\n  ", ", ")
            .replace("\n", "}")
            .replace(", L0", "{L0", 1),
            "more than 100000 values",
        ),
    ],
    ids=["surrogate-value", "surrogate-key", "duplicate-key", "deep", "line-break-in-key", "alias-bomb"],
)
def test_hostile_set_values_are_one_line(override: str, expected: str) -> None:
    with pytest.raises(FluxClusterError) as error:
        load_system("local_slurm", [override])
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_load_yaml_safely_reads_what_the_tool_writes(tmp_path: Path) -> None:
    """The one reader for any YAML file (a run's config.yaml too): same data as yaml.safe_load."""
    document = {
        "job": {"seed_base": 7, "lr": 2.5e-4},
        "system": {"slurm": {"walltime": "12:00:00"}, "env": {}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    assert load_yaml_safely(path) == yaml.safe_load(path.read_text()) == document
    with pytest.raises(FluxClusterError, match=r"config.yaml: cannot read: No such file"):
        load_yaml_safely(tmp_path / "missing" / "config.yaml")
