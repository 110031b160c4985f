"""The batch fit at the job's start, end to end on 2 CPU ranks: a fine-tuning run whose train split only
the job reads (a cluster's path; the hf workload's loaded data) and holds less than the system's default
batch trains at the largest batch the split holds, says so in its log and records it in its result log,
as submit would have; a batch the run chose is one line naming values that work."""

import json
from pathlib import Path

from data_helpers import write_image_folder
from test_finetune import encode_args
from test_hf_train import records
from test_train import finish, prepared_run, start_ranks
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.data.prep.synth_hf import synthesize_hf
from flux_cluster.models.tiny_hf import write_tiny_hf
from flux_cluster.rundir import list_runs


def mllog(result_log: Path) -> dict[str, dict]:
    """The result log's events by key (the last of each)."""
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in result_log.read_text().splitlines()]
    return {event["key"]: event for event in events}


def test_a_split_only_the_job_reads_gets_the_default_batch_fitted_at_the_jobs_start(
    cli: CliRunner, workdir: Path, tiny_pipeline: Path
) -> None:
    images = workdir / "images"
    write_image_folder(images, "captions.txt", 6)  # round(0.1 x 6) = 1 val, 5 train
    data = workdir / "on-the-cluster"
    result = cli.invoke(app, encode_args(images, data, tiny_pipeline, workdir / "cache"))
    assert result.exit_code == 0, result.output[-3000:]
    # submit sees another path (the cluster's), so it cannot read the split: the job fits the batch
    lora = ("train.benchmark=finetune", "train.mode=lora", f"train.pretrained_path={tiny_pipeline}")
    elsewhere = (*lora, "train.synthetic_data=null", "paths.data_root=/cluster/encoded")
    run_dir = prepared_run(cli, *elsewhere, "train.epochs=1")
    output = finish(start_ranks(run_dir, FLUX_DATA_DIR=str(data)))
    line = (
        "[train] batch: the train split holds 5 samples, fewer than the default global batch 16: this run "
        "takes global batch 4 (micro-batch 2 x 2 ranks); set train.global_batch_size and "
        "train.micro_batch_size to choose"
    )
    assert line in output.splitlines() and "[train] run_stop success" in output, output[-3000:]
    events = mllog(run_dir / "results" / "result_0.txt")
    assert events["global_batch_size"]["value"] == 4 and events["gradient_accumulation_steps"]["value"] == 1
    assert events["batch_fit"]["value"] == 4
    assert events["batch_fit"]["metadata"]["configured_global"] == 16
    assert events["run_stop"]["metadata"]["samples_count"] == 4  # one step of 4 in the one epoch

    # a chosen batch the split cannot hold: one line, from rank 0 alone
    chosen = prepared_run(cli, *elsewhere, "train.global_batch_size=16")
    process = start_ranks(chosen, FLUX_DATA_DIR=str(data))
    output, _ = process.communicate(timeout=300)
    assert process.returncode != 0 and output.count("error: train.global_batch_size") == 1, output[-3000:]


def test_the_hf_workload_fits_a_default_batch_to_its_loaded_split_and_names_values_for_a_chosen_one(
    cli: CliRunner, workdir: Path
) -> None:
    write_tiny_hf(workdir / "bert", kind="bert")
    synthesize_hf(workdir / "text", "text-classification", train=10, val=4)
    hf = {"model": workdir / "bert", "task": "text-classification", "data": workdir / "text", "seq_len": 16}
    sets = [
        "train.benchmark=hf",
        *(f"hf.{k}={v}" for k, v in hf.items()),
        "train.parallel=dp",
        "train.epochs=1",
    ]
    result = cli.invoke(app, ["submit", "--system", "local", *(x for s in sets for x in ("--set", s))])
    assert result.exit_code == 0, result.output[-3000:]
    assert (
        "[train] batch: the train split holds 10 samples, fewer than the default global batch 16: this run "
        "takes global batch 10 (micro-batch 5 x 2 ranks)" in result.output
    )
    (run_dir,) = list_runs(workdir / "runs")
    lines = records(run_dir)
    assert lines[0]["micro_batch_size"] == 5 and lines[-1]["summary"]["samples"] == 10
    assert mllog(run_dir / "results" / "result_0.txt")["global_batch_size"]["value"] == 10
    chosen = [*sets, "train.global_batch_size=16"]
    result = cli.invoke(app, ["submit", "--system", "local", *(x for s in chosen for x in ("--set", s))])
    assert (
        "error: train.global_batch_size: the train split has 10 samples, fewer than one global batch (16 = "
        "micro-batch 8 x 2 ranks, from the run's config): set at most 10 (micro-batch x 2 ranks x "
        "accumulation steps), e.g. --set train.micro_batch_size=5 --set train.global_batch_size=10"
    ) in result.output
    assert "Traceback" not in result.output
