"""The run-folder layout (flux_cluster/rundir.py) against the README's table and the job script templates,
so neither can drift from the functions the ranks write with and the report, sweep and API read with."""

import re
from pathlib import Path

import pytest

from flux_cluster import rundir

REPO = Path(__file__).resolve().parents[2]
RUN = Path("/runs/exp/20260101-000000-sys")
REPEAT = "<i>"  # the README's placeholder, passed where the code takes a repeat index


def readme_table() -> dict[str, str]:
    """The README's run-folder table: each top-level entry ('results/') and its text, lines joined."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Run directories", 1)[1]
    block = section.split("```", 2)[1]
    entries: dict[str, str] = {}
    name = ""
    for line in block.splitlines()[1:]:  # the first line is the fence's own
        if line[:1].strip():  # an entry starts at column 0; its text goes on in indented lines
            name, _, text = line.partition(" ")
            entries[name] = text.strip()
        elif line.strip():
            entries[name] += " " + line.strip()
    return entries


def relative(path: Path, parent: Path = RUN) -> str:
    return str(path.relative_to(parent)) + ("/" if path.suffix == "" else "")


def test_the_table_lists_exactly_the_top_level_paths() -> None:
    top = {
        rundir.config_file(RUN),
        rundir.script_file(RUN),
        rundir.jobs_file(RUN),
        rundir.slurm_dir(RUN),
        rundir.results_dir(RUN),
        rundir.checkpoints_dir(RUN),
        rundir.tensorboard_dir(RUN, REPEAT).parent,
        rundir.state_dir(RUN),
    }
    assert set(readme_table()) == {relative(path) for path in top}


def test_per_repeat_results_are_the_tables() -> None:
    text = readme_table()[relative(rundir.results_dir(RUN))]
    listed = set(re.findall(r"[a-z_]+<i>[a-z.]*/?", text))
    results = rundir.results_dir(RUN)
    code = {
        rundir.result_log(RUN, REPEAT),
        rundir.compliance_log(RUN, REPEAT),
        rundir.metrics_file(RUN, REPEAT),
        rundir.best_dir(RUN, REPEAT),
        rundir.preflight_file(RUN, REPEAT),
    }
    assert listed == {relative(path, results) for path in code}
    assert f"{relative(rundir.interrupted_dir(RUN), results)} keeps" in text


def test_per_repeat_checkpoints_and_tensorboard_are_the_tables() -> None:
    table = readme_table()
    checkpoints = rundir.checkpoints_dir(RUN)
    repeat = relative(rundir.repeat_checkpoints_dir(checkpoints, REPEAT), checkpoints)
    assert table[relative(checkpoints)].startswith(f"{repeat}step_XXXXXXXX")
    board = rundir.tensorboard_dir(RUN, REPEAT)
    assert table[relative(board.parent)].startswith(f"{relative(board, board.parent)}:")


def test_the_checkpoint_root_moves_with_train_checkpoint_dir() -> None:
    assert rundir.checkpoints_dir(RUN, None) == RUN / "checkpoints"
    assert rundir.checkpoints_dir(RUN, "/scratch/ckpt") == Path("/scratch/ckpt")


@pytest.mark.parametrize(
    "path",
    [
        rundir.throughput_file(RUN),
        rundir.eval_file(RUN, "<k>"),
        rundir.repeat_lock_path(RUN, REPEAT),
        rundir.interrupted_dir(RUN),
    ],
    ids=lambda path: path.name,
)
def test_paths_the_readme_names_elsewhere(path: Path) -> None:
    assert f"`{relative(path).rstrip('/')}" in (REPO / "README.md").read_text()


def test_a_result_logs_repeat_names_the_files_beside_it() -> None:
    log = rundir.result_log(RUN, 3)
    assert rundir.repeat_of(log) == "3"
    assert rundir.metrics_file(RUN, rundir.repeat_of(log)) == log.with_name("metrics_3.jsonl")
    assert rundir.best_dir(RUN, rundir.repeat_of(log)).name == rundir.best_weights_name(3) == "best_3"


def test_the_job_script_templates_spell_the_same_names() -> None:
    """The templates index repeats with a shell variable; the names around it are rundir's."""
    templates = "".join(p.read_text() for p in sorted((REPO / "slurm" / "templates").glob("*.j2")))
    shell = "${FLUX_EXP_INDEX}"
    for path in (
        rundir.result_log(RUN, shell),
        rundir.compliance_log(RUN, shell),
        rundir.repeat_done_file(RUN, shell),
    ):
        assert f"/{path.name}" in templates, path.name
    assert f"/{relative(rundir.repeat_done_file(RUN, shell))}" in templates
