"""flux-cluster evaluate (flux_cluster/evaluate/): latency statistics on a stand-in with known sleeps, the
CLIP score against a direct computation, LoRA loading, the JSON contract the report reads, bad input as
one line, and the Slurm job (rendered with --dry-run, then its module run here). All in-process on the
tiny pipeline at 64 px, 2 steps."""

import json
import time
from pathlib import Path

import pytest
import torch
from PIL import Image
from test_cli import error_line
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.errors import FluxClusterError
from flux_cluster.evaluate import ARGS_FILE
from flux_cluster.evaluate.clip import ClipScorer, find_clip
from flux_cluster.evaluate.latency import measure_latency, percentile
from flux_cluster.training import model as M

FAST = ["--resolution", "64", "--steps", "2", "--max-sequence-length", "16", "--runs", "2", "--warmup", "1"]
CONTRACT = {
    "schema", "kind", "created", "system", "device", "model", "target", "weights", "weights_kind",
    "meaningful", "meaningful_reason", "settings", "latency", "clip_score", "val_loss", "grid",
}  # fmt: skip
LATENCY = {"p50_s", "p90_s", "p99_s", "mean_s", "images_per_s", "peak_memory_gb", "samples"}
SETTINGS = {"steps", "guidance", "resolution", "runs", "warmup", "prompts", "seed"}


def test_latency_percentiles_of_known_sleeps() -> None:
    sleeps = [0.01 * (k + 1) for k in range(12)]  # 10..120 ms, shuffled so order cannot help
    order = [5, 0, 11, 3, 8, 1, 10, 6, 2, 9, 4, 7]
    calls: list[int] = []
    synced: list[int] = []

    def generate(i: int) -> None:
        calls.append(i)
        time.sleep(0.3 if len(calls) <= 2 else sleeps[order[i]])  # the two warm-ups are slow, not timed

    stats = measure_latency(
        generate, runs=12, warmup=2, synchronize=lambda: synced.append(1), peak_memory_gb=lambda: 1.5
    )
    assert calls == [0, 1, *range(12)] and len(synced) == 13  # after the warm-ups, then after each run
    assert stats.samples == 12 and stats.peak_memory_gb == 1.5
    for got, q in ((stats.p50_s, 50), (stats.p90_s, 90), (stats.p99_s, 99)):
        assert got == pytest.approx(percentile(sleeps, q), abs=0.012)  # sleep overshoots a little
    assert stats.mean_s == pytest.approx(sum(sleeps) / 12, abs=0.012)
    assert stats.images_per_s == pytest.approx(1 / stats.mean_s)
    assert (percentile(sleeps, 50), percentile(sleeps, 90)) == pytest.approx((0.065, 0.109))


def test_clip_score_is_the_direct_computation(tiny_pipeline: Path) -> None:
    assert find_clip(tiny_pipeline, None) == tiny_pipeline / "clip"
    scorer = ClipScorer.load(tiny_pipeline / "clip", tiny_pipeline, torch.device("cpu"))
    gradient = Image.linear_gradient("L").resize((64, 64)).convert("RGB")
    images = [Image.new("RGB", (64, 64), "red"), Image.new("RGB", (48, 80), "blue"), gradient]
    prompts = ["a red square", "a blue square", "a grey gradient " * 30]  # the last one past 77 tokens
    # torchmetrics' CLIPScore steps, written out: normalised projections, 100 * cosine, >= 0, mean
    model, processor = scorer.model, scorer.processor
    pixels = processor(images=images, return_tensors="pt")["pixel_values"]
    tokens = processor.tokenizer(prompts, padding=True, truncation=True, max_length=77, return_tensors="pt")
    with torch.no_grad():
        image = model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output)
        text = model.text_projection(model.text_model(**tokens).pooler_output)
    cosine = torch.nn.functional.cosine_similarity(image, text, dim=-1)
    direct = float((100 * cosine).clamp(min=0).mean())
    assert direct > 0
    assert scorer.score(images, prompts) == pytest.approx(direct, rel=1e-5)


def _pipe(tiny_pipeline: Path):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(tiny_pipeline, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _image(pipe) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return pipe(
        "a cat", height=64, width=64, num_inference_steps=2, guidance_scale=0.0, max_sequence_length=16,
        generator=generator, output_type="pt",
    ).images  # fmt: skip


def write_lora(tiny_pipeline: Path, folder: Path, rank: int = 4) -> Path:
    """A LoRA on the tiny transformer with non-zero B (untrained, so it changes the output)."""
    transformer = M.load_pretrained(tiny_pipeline / "transformer")
    M.add_lora(transformer, rank, float(rank), ["to_q", "to_k", "to_v", "to_out.0"])
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in transformer.named_parameters():
            if "lora_B" in name:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    return M.save_lora(M.lora_state_dict(transformer), M.lora_metadata(transformer), folder)


@pytest.fixture(scope="module")
def lora(tiny_pipeline: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lora(tiny_pipeline, tmp_path_factory.mktemp("lora"))


def test_lora_loads_and_changes_the_output_and_a_misfit_is_one_line(
    tiny_pipeline: Path, lora: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    from flux_cluster.evaluate.run import _apply_weights

    pipe = _pipe(tiny_pipeline)
    base = _image(pipe)
    cpu = torch.device("cpu")
    _apply_weights(pipe, lora, "lora", tiny_pipeline, cpu, torch.float32)
    tuned = _image(pipe)
    assert tuned.shape == base.shape and (tuned - base).abs().max() > 1e-3
    # Same modules, other shapes (a LoRA of another model): refused in one line, naming the file.
    misfit = {k: torch.zeros(8, 8) for k in load_file(lora)}
    save_file(misfit, tmp_path / "misfit.safetensors")
    with pytest.raises(FluxClusterError, match=r"misfit\.safetensors: the LoRA does not fit the model"):
        _apply_weights(
            _pipe(tiny_pipeline), tmp_path / "misfit.safetensors", "lora", tiny_pipeline, cpu, torch.float32
        )
    # Modules the model does not have (diffusers only warns and loads nothing): refused too.
    renamed = {k.replace("attn.to_q", "attn.to_nothing"): v for k, v in load_file(lora).items()}
    save_file(renamed, tmp_path / "elsewhere.safetensors")
    with pytest.raises(FluxClusterError, match=r"attn.to_nothing: .*no such layer"):
        _apply_weights(
            _pipe(tiny_pipeline),
            tmp_path / "elsewhere.safetensors",
            "lora",
            tiny_pipeline,
            cpu,
            torch.float32,
        )


@pytest.fixture(scope="module")
def run_dir(tiny_pipeline: Path, lora: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fine-tuning run directory as the job leaves it: config.yaml, results/best_0/ with the LoRA, and
    its dataset (tiny synthetic data, the shapes the tiny transformer takes)."""
    from data_helpers import make_energon_root

    from flux_cluster.config import load_system
    from flux_cluster.launch.rundir import write_run_config

    base = tmp_path_factory.mktemp("evalrun")
    data = make_energon_root(base / "data", train=4, val=8)
    sets = [
        "train.benchmark=finetune", "train.mode=lora", f"train.pretrained_path={tiny_pipeline}",
        f"paths.data_root={data}",
    ]  # fmt: skip
    run = base / "runs" / "finetune" / "20260101-000000-local"
    (run / "results" / "best_0").mkdir(parents=True)
    write_run_config(run, load_system("local", sets).config, {"name": "train"})
    (run / "results" / "best_0" / M.LORA_FILE).write_bytes(lora.read_bytes())
    return run


def test_evaluate_a_run_writes_the_contract_and_the_grid_via_its_slurm_job(
    cli: CliRunner, workdir: Path, run_dir: Path, tiny_pipeline: Path
) -> None:
    from flux_cluster.evaluate import job

    prompts = workdir / "prompts.txt"
    prompts.write_text("# two prompts\na red fox in snow\n\na lighthouse at night\n")
    args = ["evaluate", str(run_dir), "--prompts", str(prompts), *FAST, "--system", "local_slurm"]
    result = cli.invoke(app, [*args, "--submit", "--dry-run", "--runs-dir", str(workdir / "runs")])
    assert result.exit_code == 0, result.output
    (job_dir,) = (workdir / "runs" / "evaluate").iterdir()
    script = (job_dir / "job.sh").read_text()
    assert "-m flux_cluster.evaluate.job --config" in script and "#SBATCH --ntasks-per-node=1" in script
    assert str(prompts) not in script and "lighthouse" not in script  # the arguments are in a file
    sent = json.loads((job_dir / ARGS_FILE).read_text())["args"]
    assert sent[0] == str(run_dir) and sent[sent.index("--prompts") + 1] == str(prompts)
    assert sent[sent.index("--model") + 1] == str(tiny_pipeline)  # the run's train.pretrained_path
    assert not (run_dir / "results" / "eval_0.json").exists()  # a dry run evaluates nothing

    # The job's module runs the same command from that file (here, without Slurm).
    assert job.main(["--config", str(job_dir / "config.yaml")]) == 0
    document = json.loads((run_dir / "results" / "eval_0.json").read_text())
    assert set(document) == CONTRACT
    assert set(document["settings"]) == SETTINGS and document["settings"]["prompts"] == 2
    assert set(document["latency"]["base"]) == LATENCY == set(document["latency"]["tuned"])
    assert set(document["clip_score"]) == {"base", "tuned", "clip_model"}
    assert (document["schema"], document["kind"], document["system"]) == (
        1,
        "flux-cluster-eval",
        "local_slurm",
    )
    assert (document["weights_kind"], document["meaningful"], document["grid"]) == (
        "lora",
        False,
        "eval_0_grid.png",
    )
    assert "not a GPU" in document["meaningful_reason"] and "toy-sized" in document["meaningful_reason"]
    assert document["latency"]["base"]["samples"] == 2 and document["latency"]["base"]["p50_s"] > 0
    val = document["val_loss"]
    assert set(val) == {"base", "tuned"} and val["base"] > 0 and val["tuned"] != val["base"]
    with Image.open(run_dir / "results" / "eval_0_grid.png") as grid:
        assert grid.format == "PNG" and grid.width == 2 * 64 and grid.height > 2 * 64  # base | tuned, 2 rows

    # A second evaluation takes the next index; the first files stay as they were.
    from flux_cluster.evaluate.run import _write

    first = (run_dir / "results" / "eval_0.json").read_bytes()
    pattern = run_dir / "results" / "eval_{k}.json"
    written = _write(document, b"png", pattern, pattern.with_name("eval_{k}_grid.png"))
    assert written == (run_dir / "results" / "eval_1.json", run_dir / "results" / "eval_1_grid.png")
    assert json.loads(written[0].read_text())["grid"] == "eval_1_grid.png"
    assert (run_dir / "results" / "eval_0.json").read_bytes() == first


def test_bad_input_is_one_line(
    cli: CliRunner, workdir: Path, tiny_pipeline: Path, run_dir: Path, lora: Path
) -> None:
    def line(*args: str) -> str:
        return error_line(cli.invoke(app, ["evaluate", *args]))

    empty_run = workdir / "run"
    (empty_run / "results").mkdir(parents=True)
    (empty_run / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    assert "no fine-tuned weights in results/best_0/" in line(str(empty_run))
    (workdir / "prompts.txt").write_text("\n# only a comment\n")
    assert "prompts.txt: no prompts in it" in line(
        str(lora), "--model", str(tiny_pipeline), "--prompts", "prompts.txt"
    )
    got = line(str(lora), "--model", str(tiny_pipeline), "--clip", str(tiny_pipeline / "text_encoder"))
    assert "no CLIPModel with a vision tower" in got
    no_clip = workdir / "no-clip"
    no_clip.mkdir()
    for part in tiny_pipeline.iterdir():
        if part.name != "clip":
            (no_clip / part.name).symlink_to(part)
    assert "no CLIP vision weights" in line(str(no_clip)) and "--clip" in line(str(no_clip))
    (workdir / "nothing").mkdir()
    assert "nothing to evaluate in this folder" in line("nothing")
    assert "TARGET missing: does not exist" in line("missing")
    assert "--model PIPELINE_DIR is needed" in line(str(lora))
    assert "multiple of 16" in line(str(lora), "--model", str(tiny_pipeline), "--resolution", "72")
    misfit = workdir / "misfit"
    write_lora(tiny_pipeline, misfit, rank=2)
    from safetensors.torch import load_file, save_file

    tensors = load_file(misfit / M.LORA_FILE)
    save_file({k: torch.zeros(3, 5) for k in tensors}, misfit / M.LORA_FILE)
    got = line(str(misfit), "--model", str(tiny_pipeline), "--output", "e.json", *FAST)
    assert "the LoRA does not fit the model" in got and not (workdir / "e.json").exists()


def test_a_diverged_models_nan_figures_are_written_as_null() -> None:
    from flux_cluster.evaluate.run import _dumps

    document = {"val_loss": {"base": 0.5, "tuned": float("nan")}, "latency": [float("inf")]}
    written = json.loads(_dumps(document))
    assert written == {"val_loss": {"base": 0.5, "tuned": None}, "latency": [None]}
