"""flux-cluster evaluate (flux_cluster/evaluate/): latency statistics on a stand-in with known sleeps, the
CLIP score against a direct computation, LoRA loading, the JSON contract the report reads, bad input as
one line, and the Slurm job (rendered with --dry-run, then its module run here). All in-process on the
tiny pipeline at 64 px, 2 steps."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_errors import error_line
from PIL import Image
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.errors import FluxClusterError
from flux_cluster.evaluate import OPTIONS_FILE
from flux_cluster.evaluate.clip import ClipScorer, clip_mount, find_clip
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


CLIP_REPO = "openai/clip-vit-large-patch14"  # what a real FLUX text_encoder/config.json names


def _clip_inputs() -> tuple[list[Image.Image], list[str]]:
    """Images and prompts whose cosines under the tiny CLIP have both signs (checked below)."""
    gradient = Image.linear_gradient("L").resize((64, 64)).convert("RGB")
    noise = Image.effect_noise((64, 64), 80).convert("RGB")
    images = [Image.new("RGB", (64, 64), "red"), Image.new("RGB", (48, 80), "blue"), gradient, noise]
    images.append(Image.new("RGB", (64, 64), "white"))
    prompts = ["a red square", "a blue square", "a grey gradient " * 30, "static noise", "white"]
    return images, prompts  # the third prompt is past CLIP's 77 tokens


def _independent_clip_score(folder: Path, images: list[Image.Image], prompts: list[str]) -> float:
    """CLIPScore written out with transformers alone, an image at a time: the model and its own processor
    from folder, 100 * max(cosine, 0) per image, averaged."""
    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(folder, local_files_only=True).eval()
    processor = CLIPProcessor.from_pretrained(folder, local_files_only=True)
    scores, cosines = [], []
    for image, prompt in zip(images, prompts, strict=True):
        pixels = processor(images=image, return_tensors="pt")
        tokens = processor.tokenizer([prompt], truncation=True, max_length=77, return_tensors="pt")
        with torch.no_grad():
            image_features = model.get_image_features(**pixels).pooler_output[0]
            text_features = model.get_text_features(**tokens).pooler_output[0]
        cosine = float(torch.nn.functional.cosine_similarity(image_features, text_features, dim=0))
        cosines.append(cosine)
        scores.append(100 * max(cosine, 0.0))
    assert min(cosines) < 0 < max(cosines)  # so clamping each image differs from clamping the mean
    return sum(scores) / len(scores)


def _pipeline_variant(tiny_pipeline: Path, folder: Path, replace: dict[str, Path | None]) -> Path:
    """A pipeline folder linking the tiny pipeline's parts, with replace's parts swapped (None: left out)."""
    folder.mkdir(parents=True)
    for part in tiny_pipeline.iterdir():
        if part.name not in replace:
            (folder / part.name).symlink_to(part)
    for name, source in replace.items():
        if source is not None:
            (folder / name).symlink_to(source)
    return folder


def test_clip_score_is_the_direct_computation(tiny_pipeline: Path, tmp_path: Path) -> None:
    assert find_clip(tiny_pipeline, None) == tiny_pipeline / "clip"
    images, prompts = _clip_inputs()
    direct = _independent_clip_score(tiny_pipeline / "clip", images, prompts)
    scorer = ClipScorer.load(tiny_pipeline / "clip", tiny_pipeline, torch.device("cpu"))
    assert direct > 0 and scorer.score(images, prompts) == pytest.approx(direct, rel=1e-5)

    # A pipeline whose text_encoder/ is a whole CLIPModel, its weights alone (no processor files): the
    # processor is the pipeline's CLIP tokenizer with CLIP's standard image preprocessing at the model's
    # size, which is what the model's own processor does.
    whole = tmp_path / "whole-clip-text-encoder"
    whole.mkdir()
    for name in ("config.json", "model.safetensors"):
        (whole / name).symlink_to(tiny_pipeline / "clip" / name)
    pipeline = _pipeline_variant(tiny_pipeline, tmp_path / "pipeline", {"clip": None, "text_encoder": whole})
    assert find_clip(pipeline, None) == pipeline / "text_encoder"
    fallback = ClipScorer.load(pipeline / "text_encoder", pipeline, torch.device("cpu"))
    assert fallback.processor.image_processor.crop_size == {"height": 32, "width": 32}
    assert fallback.score(images, prompts) == pytest.approx(direct, rel=1e-5)


def hub_cache_repo(cache: Path, repo: str, files: dict[str, Path], commit: str = "c" * 40) -> Path:
    """repo in a Hugging Face hub cache, laid out as huggingface_hub downloads it: blobs named by their
    sha256, the snapshot's files linking to them, refs/main naming the snapshot. Returns the snapshot."""
    import hashlib
    import os

    storage = cache / ("models--" + repo.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (storage / "blobs").mkdir(exist_ok=True)
    for name, source in files.items():
        data = source.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def flux_layout(tiny_pipeline: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The tiny pipeline as a real FLUX pipeline is laid out: no clip/, and a text_encoder/ that is CLIP's
    text tower alone, its config naming openai/clip-vit-large-patch14; that model (the tiny CLIP, with
    its processor) in a temporary Hugging Face cache. Returns (pipeline, cache, snapshot)."""
    base = tmp_path_factory.mktemp("flux-layout")
    text_encoder = base / "text_encoder"
    text_encoder.mkdir()
    config = json.loads((tiny_pipeline / "text_encoder" / "config.json").read_text())
    (text_encoder / "config.json").write_text(json.dumps({**config, "_name_or_path": CLIP_REPO}))
    (text_encoder / "model.safetensors").symlink_to(tiny_pipeline / "text_encoder" / "model.safetensors")
    pipeline = _pipeline_variant(
        tiny_pipeline, base / "FLUX.1-tiny", {"clip": None, "text_encoder": text_encoder}
    )
    clip = tiny_pipeline / "clip"
    snapshot = hub_cache_repo(base / "hub", CLIP_REPO, {p.name: p for p in clip.iterdir()})
    return pipeline, base / "hub", snapshot


def test_the_default_clip_is_the_text_encoders_model_in_the_local_hugging_face_cache(
    flux_layout: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    pipeline, cache, snapshot = flux_layout
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert find_clip(pipeline, None) == snapshot  # the same folder huggingface_hub gives for it
    assert clip_mount(snapshot) == cache / "models--openai--clip-vit-large-patch14"  # with its blobs
    assert clip_mount(pipeline / "clip") == pipeline / "clip"
    from huggingface_hub import snapshot_download

    assert Path(snapshot_download(CLIP_REPO, local_files_only=True)) == snapshot

    empty = tmp_path / "empty-hub"
    empty.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(empty))
    with pytest.raises(FluxClusterError) as missing:
        find_clip(pipeline, None)
    message = str(missing.value)
    assert "\n" not in message and message.startswith(f"{pipeline}: no CLIP vision weights (looked for clip/")
    assert f"; {CLIP_REPO} in the Hugging Face cache {empty}: not there): pass --clip" in message
    assert message.endswith("pass --clip PATH, a local CLIP folder such as a download of " + CLIP_REPO)

    # The repository there, but only its config (a download that skipped the weights): not used.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "partial"))
    hub_cache_repo(tmp_path / "partial", CLIP_REPO, {"config.json": snapshot / "config.json"})
    with pytest.raises(
        FluxClusterError, match=r"cache .*partial: there, but without the vision weights\): pass --clip"
    ):
        find_clip(pipeline, None)


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


def write_transformer(tiny_pipeline: Path, folder: Path) -> Path:
    """A fully fine-tuned transformer as the training run keeps it (save_pretrained): every weight moved."""
    transformer = M.load_pretrained(tiny_pipeline / "transformer")
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in transformer.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    transformer.save_pretrained(folder)
    return folder


def test_a_fine_tuned_transformer_folder_loads_and_changes_the_output(
    tiny_pipeline: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from flux_cluster.evaluate.run import _apply_weights
    from flux_cluster.evaluate.target import resolve_target

    folder = write_transformer(tiny_pipeline, tmp_path / "best_0")
    target = resolve_target(folder, 0)
    assert (target.weights, target.weights_kind, target.pipeline) == (folder, "transformer", None)
    pipe = _pipe(tiny_pipeline)
    base = _image(pipe)
    _apply_weights(pipe, folder, "transformer", tiny_pipeline, torch.device("cpu"), torch.float32)
    tuned = _image(pipe)
    assert tuned.shape == base.shape and (tuned - base).abs().max() > 1e-3
    saved = load_file(folder / "diffusion_pytorch_model.safetensors")
    loaded = pipe.transformer.state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(loaded[k], v) for k, v in saved.items())
    # Another model's transformer (other widths): one line before anything is loaded.
    config = json.loads((folder / "config.json").read_text())
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**config, "joint_attention_dim": 64}))
    with pytest.raises(
        FluxClusterError, match=r"other: the transformer does not fit the model .*joint_attention_dim"
    ):
        _apply_weights(
            _pipe(tiny_pipeline), other, "transformer", tiny_pipeline, torch.device("cpu"), torch.float32
        )


@pytest.fixture(scope="module")
def run_dir(tiny_pipeline: Path, lora: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fine-tuning run directory as the job leaves it: config.yaml, results/best_0/ with the LoRA, and
    its dataset (tiny synthetic data, the shapes the tiny transformer takes)."""
    from data_helpers import make_energon_root

    from flux_cluster.config import load_system
    from flux_cluster.rundir import write_run_config

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
    from flux_cluster.jobs import evaluate as job

    prompts = workdir / "prompts.txt"
    prompts.write_text("# two prompts\na red fox in snow\n\na lighthouse at night\n")
    args = ["evaluate", str(run_dir), "--prompts", str(prompts), *FAST, "--system", "local_slurm"]
    result = cli.invoke(app, [*args, "--submit", "--dry-run", "--runs-dir", str(workdir / "runs")])
    assert result.exit_code == 0, result.output
    (job_dir,) = (workdir / "runs" / "evaluate").iterdir()
    script = (job_dir / "job.sh").read_text()
    assert "-m flux_cluster.jobs.evaluate --config" in script and "#SBATCH --ntasks-per-node=1" in script
    assert str(prompts) not in script and "lighthouse" not in script  # the options are in a file
    sent = json.loads((job_dir / OPTIONS_FILE).read_text())["options"]
    assert sent["target"] == str(run_dir) and sent["prompts"] == str(prompts)
    assert sent["model"] == str(tiny_pipeline)  # the run's train.pretrained_path
    assert (sent["runs"], sent["system"], sent["output"]) == (2, "local_slurm", None)
    assert not (run_dir / "results" / "eval_0.json").exists()  # a dry run evaluates nothing

    # The job's module runs the evaluation library with those options (here, without Slurm).
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
    # --runs 2 per prompt, 2 prompts: 4 timed generations of each model
    assert document["latency"]["base"]["samples"] == 4 == document["latency"]["tuned"]["samples"]
    assert document["settings"]["runs"] == 2 and document["latency"]["base"]["p50_s"] > 0
    val = document["val_loss"]
    assert set(val) == {"base", "tuned"} and val["base"] > 0 and val["tuned"] != val["base"]
    with Image.open(run_dir / "results" / "eval_0_grid.png") as grid:
        assert grid.format == "PNG" and grid.width == 2 * 64 and grid.height > 2 * 64  # base | tuned, 2 rows
    kept = sorted(p.name for p in (run_dir / "results" / "eval_0_images").iterdir())
    assert kept == ["p000_base.png", "p000_tuned.png", "p001_base.png", "p001_tuned.png"]  # full size

    # The report reads what evaluate wrote (on a CPU, peak memory null) with no warning beyond NOT
    # MEANINGFUL; this run has no result logs, so its evaluations form their system's group.
    from flux_cluster.report.build import Options, build

    (group,) = build([run_dir], Options(check=False))
    assert group.system == "local_slurm" and [e.name for e in group.evals] == ["eval_0.json"]
    assert group.warnings == [f"eval_0.json: figures NOT MEANINGFUL: {document['meaningful_reason']}"]
    assert group.evals[0].tuned and group.evals[0].tuned.peak_memory_gb is None and group.val_loss_tuned

    # A second evaluation takes the next index; the first files stay as they were.
    from flux_cluster.evaluate.run import _write

    first = (run_dir / "results" / "eval_0.json").read_bytes()
    pattern = run_dir / "results" / "eval_{k}.json"
    written = _write(document, b"png", pattern, pattern.with_name("eval_{k}_grid.png"))
    assert written == (run_dir / "results" / "eval_1.json", run_dir / "results" / "eval_1_grid.png")
    assert json.loads(written[0].read_text())["grid"] == "eval_1_grid.png"
    assert (run_dir / "results" / "eval_0.json").read_bytes() == first


def test_evaluate_submit_of_a_pipeline_writes_its_output_in_the_jobs_own_folder(
    cli: CliRunner, workdir: Path, tiny_pipeline: Path
) -> None:
    """A target that is no run (a pipeline alone): the job's run folder under --runs-dir holds its options
    and its output (results/eval.json), nothing goes to ./runs; the report finds the evaluation there."""
    from flux_cluster.jobs import evaluate as job
    from flux_cluster.report.build import Options, build

    runs = workdir / "elsewhere"
    args = ["evaluate", str(tiny_pipeline), *FAST, "--runs", "1", "--system", "local_slurm", "--submit"]
    result = cli.invoke(app, [*args, "--dry-run", "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    (job_dir,) = (runs / "evaluate").iterdir()
    sent = json.loads((job_dir / OPTIONS_FILE).read_text())["options"]
    assert sent["output"] == str(job_dir / "results" / "eval.json")
    assert not (workdir / "runs").exists()
    assert job.main(["--config", str(job_dir / "config.yaml")]) == 0
    assert sorted(p.name for p in (job_dir / "results").iterdir()) == [
        "eval.json",
        "eval_grid.png",
        "eval_images",
    ]
    (group,) = build([runs], Options(check=False))
    assert [e.name for e in group.evals] == ["eval.json"] and group.system == "local_slurm"
    assert not (workdir / "runs").exists()


@pytest.fixture(scope="module")
def evaluated(
    flux_layout: tuple[Path, Path, Path], lora: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`flux-cluster evaluate` as a user runs it, in its own process: a LoRA file over a pipeline laid out
    as a real FLUX one, whose CLIP comes from the Hugging Face cache HF_HUB_CACHE names; 3 prompts, 2
    timed generations of each. Returns (the JSON it wrote, the process)."""
    pipeline, cache, _snapshot = flux_layout
    base = tmp_path_factory.mktemp("evaluated")
    prompts = base / "prompts.txt"
    # the third past CLIP's 77 tokens and the 16 of --max-sequence-length: cut, without a notice
    prompts.write_text("a red fox\na lighthouse\n" + "an astronaut over the moon " * 30 + "\n")
    output = base / "cpu-box" / "lora.json"
    args = [str(lora), "--model", str(pipeline), "--prompts", str(prompts), *FAST, "--runs", "2"]
    args += ["--system", "cpu_box", "--output", str(output)]
    done = subprocess.run(
        [sys.executable, "-m", "flux_cluster", "evaluate", *args],
        env={**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return output, done


def test_evaluate_times_each_prompt_runs_times_takes_clip_from_the_cache_and_is_quiet(
    evaluated: tuple[Path, subprocess.CompletedProcess[str]], flux_layout: tuple[Path, Path, Path]
) -> None:
    output, done = evaluated
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 timed generations per prompt x 3 prompts per model" in done.stderr
    # torchvision's image processor fallbacks, diffusers' notes on a LoRA without text-encoder keys and on a
    # prompt cut at an encoder's length
    for noise in ("torchvision", "ImageProcessorPil", "No LoRA keys", "was truncated", "Traceback"):
        assert noise not in done.stderr + done.stdout, (noise, done.stderr[-3000:])
    document = json.loads(output.read_text())
    assert document["clip_score"]["clip_model"] == str(flux_layout[2])  # the cached snapshot
    assert document["settings"]["runs"] == 2 and document["settings"]["prompts"] == 3
    for side in ("base", "tuned"):
        assert (
            document["latency"][side]["samples"] == 6 and document["latency"][side]["peak_memory_gb"] is None
        )
    assert document["grid"] == "lora_grid.png"
    with Image.open(output.with_name("lora_grid.png")) as grid:
        assert grid.size == (2 * 64, 14 + 3 * (14 + 64))  # base | tuned, a row per prompt


def test_evaluations_outside_a_run_reach_the_report_by_system_without_false_warnings(
    evaluated: tuple[Path, subprocess.CompletedProcess[str]],
    tiny_pipeline: Path,
    cli: CliRunner,
    workdir: Path,
) -> None:
    """The JSON the real command writes (on a CPU: peak memory null) is read without a warning beyond
    NOT MEANINGFUL; each system's evaluations are a group of the side-by-side table."""
    lora_json, done = evaluated
    assert done.returncode == 0, done.stderr[-3000:]
    # The base model alone, the 8 built-in prompts once each (fewer runs than prompts): its JSON goes
    # under the runs folder (runs/evaluate/<time>-<name>/eval.json), not into the working folder
    base = ["evaluate", str(tiny_pipeline), *FAST, "--runs", "1", "--warmup", "0", "--system", "gpu_box"]
    result = cli.invoke(app, base)
    assert result.exit_code == 0, result.output
    (written,) = (workdir / "runs" / "evaluate").glob(f"*-{tiny_pipeline.name}/eval.json")
    assert not (workdir / "eval.json").exists()
    (written.parent / "eval.json").rename(workdir / "eval.json")
    (written.parent / "eval_grid.png").rename(workdir / "eval_grid.png")
    document = json.loads((workdir / "eval.json").read_text())
    assert document["latency"]["base"]["samples"] == 8 and document["latency"]["tuned"] is None

    result = cli.invoke(app, ["report", str(lora_json.parent), "eval.json", "--no-check", "-f", "json"])
    assert result.exit_code == 0, result.output
    groups = {g["system"]: g for g in json.loads(result.stdout)["groups"]}
    assert set(groups) == {"cpu_box", "gpu_box"}
    reason = "measured on cpu, not a GPU; a toy-sized transformer"
    for system, name in (("cpu_box", "lora.json"), ("gpu_box", "eval.json")):
        group = groups[system]
        assert group["benchmark"] == "evaluate" and group["runs"] == [] and len(group["evals"]) == 1
        (warning,) = group["warnings"]  # nothing but what the figures are
        assert warning.startswith(f"{name}: figures NOT MEANINGFUL: {reason}"), group["warnings"]
        (e,) = group["evals"]
        assert e["base"]["p90_s"] > 0 and e["base"]["peak_memory_gb"] is None and e["grid"]
    assert (
        groups["cpu_box"]["evals"][0]["tuned"]["samples"] == 6
        and groups["cpu_box"]["clip_score_tuned"] is not None
    )
    assert groups["gpu_box"]["inference_p50_s"] == groups["gpu_box"]["evals"][0]["base"]["p50_s"]

    markdown = cli.invoke(
        app, ["report", str(lora_json.parent), "eval.json", "--no-check", "-f", "md"]
    ).stdout
    side = markdown.split("## Fine-tuning, side by side")[1].split("\n\n")[1].splitlines()
    header = [cell.strip() for cell in side[0].split("|")]
    cells = [[cell.strip() for cell in row.split("|")] for row in side[2:]]
    system, mode = header.index("system"), header.index("mode")
    assert [(row[system], row[mode]) for row in cells] == [("cpu_box", "eval only"), ("gpu_box", "eval only")]
    page = cli.invoke(app, ["report", str(lora_json.parent), "eval.json", "--no-check", "-f", "html"]).stdout
    assert page.count('<img src="data:image/png;base64,') == 2 and "the base model alone" in page
    assert 'id="summary"' not in page  # no MLPerf groups here


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


def test_prompt_files_are_regular_bounded_and_capped(tmp_path: Path) -> None:
    """/dev/zero read until MemoryError, a FIFO hung, a 5 MB prompt cost 3 GB, a 300 MB file became 3.1 M
    prompts: each is now one line, read in bounded memory."""
    from flux_cluster.evaluate.run import MAX_PROMPT_CHARS, MAX_PROMPTS, read_prompts

    def refused(path: Path | str) -> str:
        with pytest.raises(FluxClusterError) as info:
            read_prompts(Path(path))
        assert "\n" not in str(info.value)
        return str(info.value)

    assert "not a regular file" in refused("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in refused(fifo)  # returns at once: no writer is waited for
    (tmp_path / "link").symlink_to(fifo)
    assert "symbolic link" in refused(tmp_path / "link")
    long = tmp_path / "long.txt"
    long.write_text("a fox\n" + "x" * (MAX_PROMPT_CHARS + 1) + "\n")
    assert f"line 2: a prompt of {MAX_PROMPT_CHARS + 1:,} characters; at most" in refused(long)
    many = tmp_path / "many.txt"
    many.write_text("# header\n" + "".join(f"prompt {i}\n" for i in range(MAX_PROMPTS + 1)))
    assert f"more than {MAX_PROMPTS} prompts (line {MAX_PROMPTS + 2})" in refused(many)
    huge = tmp_path / "huge.txt"
    with huge.open("wb") as handle:
        handle.truncate(300 * 1024 * 1024)  # sparse: 300 MB on paper, nothing on disk
    assert "the prompt file is over 4 MiB" in refused(huge)
    exact = tmp_path / "exact.txt"
    exact.write_text("".join(f"p{i}\n" for i in range(MAX_PROMPTS)) + "\n# done\n")
    assert len(read_prompts(exact)) == MAX_PROMPTS


def test_the_grid_is_small_enough_to_show_and_the_full_images_are_kept(tmp_path: Path) -> None:
    """Eight 512 px prompts, base | tuned, made a 9.5 MB PNG the report would not show: the grid is
    thumbnails in a palette PNG, and the full-size images are written beside it."""
    import io

    import numpy as np

    from flux_cluster.evaluate.grid import MAX_ROWS, THUMBNAIL
    from flux_cluster.evaluate.run import _write, grid_png

    rng = np.random.default_rng(0)
    noise = [Image.fromarray(rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)) for _ in range(MAX_ROWS)]
    columns = [("base", noise), ("tuned", noise[::-1])]
    png = grid_png(columns, [f"prompt {i}" for i in range(MAX_ROWS)])
    assert len(png) < 3 * 1024 * 1024  # worst case (noise, 16 rows); the report shows up to 8 MiB
    with Image.open(io.BytesIO(png)) as grid:
        assert grid.format == "PNG" and grid.width == 2 * THUMBNAIL
    json_path = tmp_path / "out" / "eval.json"
    _write({"kind": "x"}, png, json_path, json_path.with_name("eval_grid.png"), columns[:1])
    kept = sorted((tmp_path / "out" / "eval_images").iterdir())
    assert len(kept) == MAX_ROWS and kept[0].name == "p000_base.png"
    with Image.open(kept[0]) as first:
        assert first.size == (512, 512)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "eval.json",
        "eval_grid.png",
        "eval_images",
    ]


def test_generations_show_images_per_second_and_time_left() -> None:
    """A job's log (no terminal) gets a line every interval: images so far, images/s, seconds left."""
    from flux_cluster.evaluate.latency import ImageProgress

    now = [0.0]
    lines: list[str] = []
    with ImageProgress("base", 10, lines.append, terminal=False, interval_s=30, clock=lambda: now[0]) as bar:
        measure_latency(
            lambda i: now.__setitem__(0, now[0] + 10),
            runs=8,
            warmup=2,
            clock=lambda: now[0],
            made=bar.advance,
        )
    assert lines[0] == "base: 3/10 images, 0.10 images/s, 70 s left" and len(lines) == 3


def test_evaluates_default_output_is_under_the_runs_folder(workdir: Path, tiny_pipeline: Path) -> None:
    from flux_cluster.evaluate.run import output_paths
    from flux_cluster.evaluate.target import resolve_target

    json_path, grid = output_paths(resolve_target(tiny_pipeline, 0), None, Path("elsewhere"))
    assert json_path.parent.parent == (workdir / "elsewhere" / "evaluate").absolute()  # the caller's root
    assert json_path.parent.name.endswith(f"-{tiny_pipeline.name}") and grid.name == "eval_grid.png"


def test_the_evaluate_jobs_options_round_trip_and_a_bad_file_is_one_line(tmp_path: Path) -> None:
    """The job reads the options evaluate --submit wrote (no command line); a damaged file names itself
    and the key."""
    from flux_cluster.evaluate.options import EvalOptions, options_to_json
    from flux_cluster.jobs.evaluate import read_options

    options = EvalOptions(target=tmp_path / "run", prompts=tmp_path / "p.txt", guidance=3.5, steps=4)
    path = tmp_path / OPTIONS_FILE
    path.write_text(json.dumps({"options": options_to_json(options)}))
    assert read_options(path) == options
    for bad, expected in (
        ({"runs": 0}, "--runs 0: expected at least 1"),
        ({"runs": "2"}, "options: runs: got '2', expected an integer"),
        ({"model": 7}, "options: model: got 7, expected a path"),
        ({"resolution": 100}, "--resolution 100: expected a multiple of 16"),
        ({"args": ["x"]}, "options: unknown key 'args'"),
    ):
        path.write_text(json.dumps({"options": {**options_to_json(options), **bad}}))
        with pytest.raises(FluxClusterError) as info:
            read_options(path)
        line = str(info.value)
        assert line.startswith(f"{path}: options") and expected in line and "\n" not in line
    path.write_text('{"options": ["x"]}')
    with pytest.raises(FluxClusterError, match="got list, expected an object of evaluate's options"):
        read_options(path)
