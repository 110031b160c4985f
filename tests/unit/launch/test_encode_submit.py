"""data encode --submit without Slurm: the rendered jobs (array, GPU, mounts), the options file the jobs
read, and bad input refused in one line before anything is written. The real Slurm run is in
tests/integration/test_slurm.py (test_data_encode_submit_encodes_with_a_two_task_array_and_finishes)."""

import json
from pathlib import Path

import pytest
from data_helpers import write_image_folder
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.rundir import list_runs


@pytest.fixture
def images(workdir: Path) -> Path:
    write_image_folder(workdir / "images", "captions.txt", 4)
    return workdir / "images"


def encode_args(images: Path, out: Path, pipeline: Path, *more: str) -> list[str]:
    return ["data", "encode", str(images), str(out), "--model", str(pipeline), "--resolution", "64", *more]


def stage_runs() -> dict[str, Path]:
    runs = list_runs(Path("runs"))
    return {run.name.split("-", 3)[3]: run for run in runs}  # <date>-<time>-<system>-<stage>


@pytest.mark.parametrize("system", ["dgx_h100x8", "mi300x8", "local_slurm"])
def test_dry_run_renders_an_encode_array_and_a_finish_job_with_the_options_in_a_file(
    cli: CliRunner, workdir: Path, images: Path, tiny_pipeline: Path, system: str
) -> None:
    """Relative paths become absolute; the options reach the jobs in encode.json, not in the script; a
    GPU per encode task where the system requests GPUs; in a container the image folder and the model
    are mounted read-only at their own paths, the cache read-write, OUT as the data root."""
    from flux_cluster.data.prep.job_options import read_encode_options

    args = encode_args(Path("images"), Path("out"), tiny_pipeline, "--cache", "cache", "--batch-size", "3")
    result = cli.invoke(app, [*args, "--submit", "--system", system, "--tasks", "3", "--dry-run"])
    assert result.exit_code == 0, result.output
    runs = stage_runs()
    assert set(runs) == {"encode", "encode-finish"}
    assert all(run.parent.name == "data-encode" for run in runs.values())
    for stage, run in runs.items():
        options = read_encode_options(run / "encode.json")
        assert (options.images, options.output, options.cache) == (images, workdir / "out", workdir / "cache")
        assert (options.model, options.resolution, options.batch_size) == (tiny_pipeline, 64, 3)
        script = (run / "job.sh").read_text()
        assert f'--config "$_fc_config" --stage {stage} &' in script and "--batch-size" not in script
        gpu = stage == "encode" and system != "local_slurm"
        assert ("#SBATCH --gpus-per-node=1\n" in script) == gpu
        assert ("#SBATCH --array=0-2\n" in script) == (stage == "encode")
        mounts = [f"{images}:{images}:ro", f"{tiny_pipeline}:{tiny_pipeline}:ro", f"{workdir / 'cache'}:"]
        mounts.append(f"{workdir / 'out'}:/data")
        assert all((mount in script) == (system != "local_slurm") for mount in mounts), script
        # a task's container sees the GPU Slurm gave it: tasks share a node, in docker too
        assert "#SBATCH --exclusive\n" not in script
        assert ("_fc_own_gpus" in script) == (system == "mi300x8")
    assert "--dependency=afterok:<job id of the stage before>" in result.output
    assert not (workdir / "out").exists() and not (workdir / "cache").exists()  # a dry run makes neither


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no images", "images-absent: no such folder; expected a folder of captioned images"),
        ("one image", "1 usable image(s); fine-tuning needs at least 2"),
        ("bad pipeline", "model_index.json: missing: expected a diffusers FLUX pipeline folder"),
        ("no slurm", "system local has no Slurm (launcher local); drop --submit"),
        ("unsafe path", "my images': Slurm jobs need paths of letters, digits and _@+=./- only"),
        ("unsafe runs dir", "my runs': Slurm jobs need paths of letters, digits and _@+=./- only"),
        ("without --submit", "--tasks, --dry-run: only with --submit"),
    ],
)
def test_bad_input_is_one_line_before_anything_is_submitted(
    cli: CliRunner, workdir: Path, images: Path, tiny_pipeline: Path, case: str, message: str
) -> None:
    pipeline, submit = tiny_pipeline, ["--submit", "--system", "local_slurm"]
    if case == "no images":
        images = workdir / "images-absent"
    elif case == "one image":
        write_image_folder(images := workdir / "one", "captions.txt", 1)
    elif case == "bad pipeline":
        (pipeline := workdir / "not-a-pipeline").mkdir()
    elif case == "no slurm":
        submit = ["--submit"]
    elif case == "unsafe path":
        images = images.rename(workdir / "my images")
    elif case == "unsafe runs dir":
        submit += ["--runs-dir", "my runs"]
    else:
        submit = ["--tasks", "2", "--dry-run"]
    result = cli.invoke(app, [*encode_args(images, workdir / "out", pipeline, "--cache", "cache"), *submit])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not any(p.name in ("runs", "my runs", "out", "cache") for p in workdir.iterdir())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"resolution": "64"}, "encode.json: resolution: got '64', expected an integer"),
        ({"images": "images"}, "encode.json: images: got 'images', expected an absolute path"),
        ({"strict": 1}, "encode.json: strict: got 1, expected true or false"),
        ({"colour": "red"}, "encode.json: colour: unknown key, expected one of images, output, model"),
        ({"cache": None, "seed": None}, "encode.json: seed: got None, expected an integer"),
        (None, "encode.json: model: missing, expected an absolute path"),
        ([], "encode.json: got list, expected a JSON object"),
    ],
)
def test_an_encode_job_refuses_a_bad_options_file_in_one_line(
    cli: CliRunner,
    workdir: Path,
    images: Path,
    tiny_pipeline: Path,
    capsys: pytest.CaptureFixture[str],
    edit: dict | list | None,
    message: str,
) -> None:
    """The job reads its options from encode.json beside its config: a damaged file is one line on
    stderr naming the file and the key, exit code 2, before any model is loaded."""
    from flux_cluster.jobs.data import main as data_job

    args = encode_args(images, workdir / "out", tiny_pipeline, "--cache", "cache")
    assert cli.invoke(app, [*args, "--submit", "--system", "local_slurm", "--dry-run"]).exit_code == 0
    run = stage_runs()["encode"]
    options = json.loads((run / "encode.json").read_text())
    if isinstance(edit, dict):
        options.update(edit)
    elif edit is None:
        del options["model"]
    else:
        options = edit
    (run / "encode.json").write_text(json.dumps(options))
    capsys.readouterr()
    assert data_job(["--config", str(run / "config.yaml"), "--stage", "encode"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run / 'encode.json'}: ") and message in err, err
    assert len(err.splitlines()) == 1


def test_submit_refuses_an_output_holding_other_files_before_anything_is_written(
    cli: CliRunner, workdir: Path, images: Path, tiny_pipeline: Path
) -> None:
    (out := workdir / "out").mkdir()
    (out / "notes.txt").write_text("mine")
    args = [
        *encode_args(images, out, tiny_pipeline, "--cache", "cache"),
        "--submit",
        "--system",
        "local_slurm",
    ]
    result = cli.invoke(app, args)
    assert result.exit_code == 2 and "holds other files; choose a new or empty folder" in result.output
    assert not (workdir / "runs").exists() and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
