"""The evaluation itself: the base pipeline, then the same pipeline with the fine-tuned weights, each timed
over the same prompts and seeds, scored with CLIP and (for a run) on the run's validation split; the
results as the JSON the report reads (results/eval_<k>.json) and a PNG grid of the samples."""

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import flux_cluster.models.quiet  # noqa: F401  (before diffusers: quiets torchao's import warnings)
from flux_cluster.config.transformer_config import read_transformer_config
from flux_cluster.console import cli_console
from flux_cluster.errors import FluxClusterError, allocation_failed, first_line, write_error
from flux_cluster.evaluate import KIND, SCHEMA, base_label, grid_name
from flux_cluster.evaluate.clip import ClipScorer, find_clip
from flux_cluster.evaluate.edits import edit_inputs
from flux_cluster.evaluate.grid import grid_png, images_dir, save_images
from flux_cluster.evaluate.latency import ImageProgress, Latency, measure_latency
from flux_cluster.evaluate.options import EvalOptions
from flux_cluster.evaluate.target import Target, is_pipeline, resolve_target
from flux_cluster.models.quiet import TRUNCATED, notices_dropped
from flux_cluster.safe_text import printable

if TYPE_CHECKING:
    import torch
    from diffusers import FluxPipeline
    from PIL.Image import Image

DEFAULT_PROMPTS = (
    "a photo of a red fox sitting in fresh snow, morning light",
    "a bowl of ramen with a soft-boiled egg, top view",
    "a lighthouse on a rocky coast during a storm",
    "a watercolor painting of a city street in the rain",
    "a close-up portrait of an old fisherman, black and white",
    "a modern living room with large windows and plants",
    "an astronaut riding a bicycle on the moon",
    "a bookshelf full of colorful books in a cozy library",
)
MEANINGFUL_PARAMETERS = 1_000_000_000
"""Below this the transformer is a toy (the tiny or small preset), not a FLUX.1 model."""


@dataclass(frozen=True)
class Settings:
    steps: int
    guidance: float
    resolution: int
    max_sequence_length: int


@dataclass
class Measured:
    latency: Latency
    images: list["Image"]
    val_loss: float | None


@dataclass(frozen=True)
class EvalResult:
    document: dict[str, Any]
    json_path: Path
    grid_path: Path


MAX_PROMPTS = 256
"""Each prompt is generated --runs times per model: more is a mistaken file, not an evaluation."""
MAX_PROMPT_CHARS = 4096
"""Past what T5 reads (at most 512 tokens, a few characters each): the rest would be cut unseen."""
MAX_PROMPTS_BYTES = 4 * 1024 * 1024
"""The prompt file's size: MAX_PROMPTS prompts of MAX_PROMPT_CHARS, with room for comments."""


def read_prompts(path: Path | None) -> list[str]:
    """One prompt per line; blank lines and lines starting with '#' are skipped. A regular file only (not
    /dev/zero or a FIFO), at most MAX_PROMPTS_BYTES, MAX_PROMPTS prompts of MAX_PROMPT_CHARS each."""
    from flux_cluster.outside import OutsideFileError, read_bounded

    if path is None:
        return list(DEFAULT_PROMPTS)
    try:
        text = read_bounded(path, MAX_PROMPTS_BYTES, what="the prompt file").decode("utf-8")
    except OutsideFileError as exc:
        raise FluxClusterError(f"--prompts {exc}") from None
    except UnicodeDecodeError:
        raise FluxClusterError(f"--prompts {path}: not UTF-8 text: expected one prompt per line") from None
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        prompt = line.strip()
        if not prompt or prompt.startswith("#"):
            continue
        if len(prompt) > MAX_PROMPT_CHARS:
            raise FluxClusterError(
                f"--prompts {path}: line {number}: a prompt of {len(prompt):,} characters; at most "
                f"{MAX_PROMPT_CHARS:,} (T5 reads no more than 512 tokens)"
            )
        if len(prompts) == MAX_PROMPTS:
            raise FluxClusterError(
                f"--prompts {path}: more than {MAX_PROMPTS} prompts (line {number}); at most {MAX_PROMPTS}, "
                "each generated --runs times per model"
            )
        prompts.append(prompt)
    if not prompts:
        raise FluxClusterError(f"--prompts {path}: no prompts in it: expected one prompt per line")
    return prompts


def pipeline_folder(target: Target, model: Path | None) -> Path:
    if target.weights is None:  # TARGET is a pipeline: the base model alone
        assert target.pipeline is not None
        if model is not None and model.resolve() != target.pipeline.resolve():
            raise FluxClusterError(
                f"TARGET {target.path} is a pipeline and --model names another ({model}): give one of them"
            )
        return target.pipeline
    chosen = model or target.pipeline
    if chosen is None:
        raise FluxClusterError(
            f"TARGET {target.path}: --model PIPELINE_DIR is needed (the local FLUX pipeline the weights were "
            "tuned from)"
        )
    if not is_pipeline(chosen):
        raise FluxClusterError(
            f"--model {chosen}: not a FLUX pipeline folder (model_index.json naming a transformer)"
        )
    return chosen


def evaluate(options: EvalOptions, runs_root: Path, log: Callable[[str], None] = print) -> EvalResult:
    """runs_root: the runs folder, where an evaluation outside a run writes without --output."""
    target = resolve_target(options.target, options.exp)
    pipeline = pipeline_folder(target, options.model)
    prompts = read_prompts(options.prompts)
    edits = edit_inputs(target, options.resolution)  # an edit run: its held-out pairs, edited
    if edits is not None:
        if options.prompts is not None:
            raise FluxClusterError(
                f"--prompts {options.prompts}: {target.path} is an edit run, evaluated on the prompts of its "
                "held-out pairs; leave --prompts out"
            )
        prompts = edits.prompts
    clip_folder = find_clip(pipeline, options.clip)
    json_path, grid_path = output_paths(target, options.output, runs_root)  # checked before the slow part

    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    pipe = _load_pipeline(pipeline, device, dtype, kontext=edits is not None)
    if target.weights is not None:  # before the base model runs: a misfit is found in seconds
        check = _check_lora_fits if target.weights_kind == "lora" else _check_transformer_fits
        check(pipe.transformer, target.weights, pipeline)
    settings = _settings(pipe, options)
    log(
        f"evaluating {printable(str(target.path))} on {device.type}: {options.warmup} warm-up + "
        f"{options.runs} timed generations per prompt x {len(prompts)} prompts per model, "
        f"{settings.steps} steps, {settings.resolution}px"
    )
    controls = edits.controls if edits else None
    quantized = target.weights is not None and target.base_precision != "bf16"
    if quantized:  # served as it trained, and compared with the base it trained on: quantized alike
        _quantized_with_adapters_off(pipe, target, pipeline, device, dtype, log)
    label = base_label(target.base_precision if quantized else None)
    base = _measure(pipe, prompts, settings, options, target, device, dtype, label, log, controls)
    log(f"{label}: p50 {base.latency.p50_s:.3f} s, {base.latency.images_per_s:.2f} images/s")
    tuned = None
    if target.weights is not None:
        assert target.weights_kind is not None
        if quantized:
            pipe.transformer.enable_adapters()
        else:
            _apply_weights(pipe, target.weights, target.weights_kind, pipeline, device, dtype)
        tuned = _measure(pipe, prompts, settings, options, target, device, dtype, "tuned", log, controls)
        log(f"tuned: p50 {tuned.latency.p50_s:.3f} s, {tuned.latency.images_per_s:.2f} images/s")
    parameters = weights_of(pipe.transformer)
    del pipe
    scorer = ClipScorer.load(clip_folder, pipeline, device)
    clip_base = scorer.score(base.images, prompts)
    clip_tuned = scorer.score(tuned.images, prompts) if tuned else None

    reasons = []
    if device.type != "cuda":
        reasons.append(f"measured on {device.type}, not a GPU")
    if parameters < MEANINGFUL_PARAMETERS:
        reasons.append(f"a toy-sized transformer ({parameters:,} parameters), not FLUX.1")
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": KIND,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "system": options.system,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "model": str(pipeline.absolute()),
        "target": str(target.path.absolute()),
        "weights": str(target.weights.absolute()) if target.weights else None,
        "weights_kind": target.weights_kind,
        "meaningful": not reasons,
        "meaningful_reason": "; ".join(reasons) or None,
        "settings": {
            "steps": settings.steps,
            "guidance": settings.guidance,
            "resolution": settings.resolution,
            "runs": options.runs,
            "warmup": options.warmup,
            "prompts": len(prompts),
            "seed": options.seed,
        },
        "latency": {"base": base.latency.to_json(), "tuned": tuned.latency.to_json() if tuned else None},
        "clip_score": {"base": clip_base, "tuned": clip_tuned, "clip_model": str(clip_folder.absolute())},
        "val_loss": None
        if base.val_loss is None
        else {"base": base.val_loss, "tuned": tuned.val_loss if tuned else None},
        "grid": None,
    }
    if edits is not None:  # an edit run's documents only: a text-to-image one keeps its keys
        document["edits"] = {"pairs": edits.names}
    if quantized:  # likewise: the base column's precision, where it is not the pipeline's own
        document["base_precision"] = target.base_precision
    columns = [("base", base.images)] + ([("tuned", tuned.images)] if tuned else [])
    columns = ([("control", edits.controls)] if edits else []) + columns
    shown = [(label if title == "base" else title, images) for title, images in columns]
    json_path, grid_path = _write(document, grid_png(shown, prompts), json_path, grid_path, columns)
    return EvalResult(document, json_path, grid_path)


def weights_of(transformer: "torch.nn.Module") -> int:
    """The transformer's size in weights: a quantized base's layers count in x out each, not their packed
    bytes (which are buffers, not parameters: quantized_base.py)."""
    from flux_cluster.training.quantized_base import logical_parameter_count

    return logical_parameter_count(transformer)


def _quantized_with_adapters_off(
    pipe: "FluxPipeline",
    target: Target,
    pipeline: Path,
    device: "torch.device",
    dtype: "torch.dtype",
    log: Callable[[str], None],
) -> None:
    """A LoRA run on a quantized base (train.base_precision) as it trained: the adapters loaded unfused
    beside the frozen layers, which are then quantized; the adapters left off, so the base measured first is
    the quantized base, the one the tuned model differs from by its adapters alone."""
    from flux_cluster.training.quantized_base import quantize_base

    assert target.weights is not None and target.weights_kind is not None
    _apply_weights(pipe, target.weights, target.weights_kind, pipeline, device, dtype, fuse=False)
    log(quantize_base(pipe.transformer.requires_grad_(False), target.base_precision, dtype).describe())
    pipe.transformer.disable_adapters()


def _load_pipeline(
    folder: Path, device: "torch.device", dtype: "torch.dtype", kontext: bool = False
) -> "FluxPipeline":
    """kontext: as FluxKontextPipeline (an edit run's), which edits an image."""
    from diffusers import FluxKontextPipeline, FluxPipeline

    from flux_cluster.models.quiet import held_transformers_logs, no_progress_bars
    from flux_cluster.training.pretrained import check_headers

    check_headers(folder)  # config.json's shapes and the weights' headers, before diffusers builds it
    try:
        with no_progress_bars(), held_transformers_logs():
            kind = FluxKontextPipeline if kontext else FluxPipeline
            pipe = kind.from_pretrained(folder, dtype=dtype, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, RuntimeError, MemoryError) as exc:
        raise _load_error(f"--model {folder}: cannot load it as a FLUX pipeline", exc) from None
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


def _load_error(what: str, exc: BaseException) -> FluxClusterError:
    """One line for a failed from_pretrained: a failed allocation said as one, not as a damaged file."""
    if allocation_failed(exc):
        return FluxClusterError(printable(f"{what}: out of memory ({first_line(exc)})"))
    return FluxClusterError(printable(f"{what} ({first_line(exc)})"))


def _settings(pipe: "FluxPipeline", options: EvalOptions) -> Settings:
    """Defaults by model: FLUX.1-dev (guidance-distilled) 28 steps at guidance 3.5 and 512 T5 tokens;
    FLUX.1-schnell 4 steps, no guidance, 256 tokens (as Black Forest Labs run them)."""
    dev = bool(pipe.transformer.config.guidance_embeds)
    return Settings(
        steps=options.steps or (28 if dev else 4),
        guidance=options.guidance if options.guidance is not None else (3.5 if dev else 0.0),
        resolution=options.resolution,
        max_sequence_length=options.max_sequence_length or (512 if dev else 256),
    )


def _measure(
    pipe: "FluxPipeline",
    prompts: list[str],
    settings: Settings,
    options: EvalOptions,
    target: Target,
    device: "torch.device",
    dtype: "torch.dtype",
    label: str,
    log: Callable[[str], None],
    controls: Sequence["Image"] | None = None,
) -> Measured:
    """options.runs timed generations of each prompt, the prompts in turn. Prompt p always gets seed + p:
    base and tuned images of a prompt start from the same noise, and every generation of it is the same
    image, which is scored and drawn. controls: an edit run's control images, prompt p edits controls[p]."""
    import torch

    images: dict[int, Image] = {}

    def generate(i: int) -> None:
        p = i % len(prompts)
        generator = torch.Generator("cpu").manual_seed(options.seed + p)  # the same noise on any device
        with notices_dropped(type(pipe).__module__, TRUNCATED):  # a long prompt, cut at each encoder's length
            image = pipe(
                prompt=prompts[p],  # by name: FluxKontextPipeline's first argument is the image
                height=settings.resolution,
                width=settings.resolution,
                num_inference_steps=settings.steps,
                guidance_scale=settings.guidance,
                max_sequence_length=settings.max_sequence_length,
                generator=generator,
                output_type="pil",
                **({} if controls is None else _edit_arguments(controls[p], settings)),
            ).images[0]
        images.setdefault(p, image)

    cuda = device.type == "cuda"
    runs = options.runs * len(prompts)
    with ImageProgress(label, options.warmup + runs, log, cli_console(stderr=True).is_terminal) as bar:
        latency = measure_latency(
            generate,
            runs=runs,
            warmup=options.warmup,
            synchronize=(lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None),
            reset_peak_memory=(lambda: torch.cuda.reset_peak_memory_stats(device))
            if cuda
            else (lambda: None),
            peak_memory_gb=(lambda: torch.cuda.max_memory_allocated(device) / 1e9)
            if cuda
            else (lambda: None),
            made=bar.advance,
        )
    val_loss = _val_loss(pipe.transformer, target, device, dtype) if target.data_root else None
    return Measured(latency, [images[p] for p in range(len(prompts))], val_loss)


def _edit_arguments(control: "Image", settings: Settings) -> dict[str, Any]:
    """FluxKontextPipeline's arguments for editing control at the evaluation's resolution, as trained:
    no resizing to Kontext's preferred resolutions."""
    return {"image": control, "max_area": settings.resolution**2, "_auto_resize": False}


def _val_loss(
    transformer: "torch.nn.Module", target: Target, device: "torch.device", dtype: "torch.dtype"
) -> float:
    """The MLPerf validation loss on the run's val split, as the fine-tuning run computed it."""
    from flux_cluster.data.loader import val_loader
    from flux_cluster.training.kontext import velocity_predictor
    from flux_cluster.training.rectified_flow import validation_loss

    assert target.data_root is not None
    loss, _ = validation_loss(
        velocity_predictor(transformer, dtype, target.train_guidance),
        val_loader(target.data_root, batch_size=4, rank=0, world_size=1),
        device,
    )
    return loss


def _apply_weights(
    pipe: "FluxPipeline",
    weights: Path,
    kind: str,
    pipeline: Path,
    device: "torch.device",
    dtype: "torch.dtype",
    fuse: bool = True,
) -> None:
    """The fine-tuned weights into the base pipeline: a LoRA through diffusers' load_lora_weights (fused
    into the weights unless ``fuse`` is off), a transformer folder in place of the base transformer.
    Weights that do not fit are one line."""
    from flux_cluster.models.quiet import held_transformers_logs, no_progress_bars

    if kind == "lora":
        _check_lora_fits(pipe.transformer, weights, pipeline)
        try:
            with no_progress_bars(), held_transformers_logs(), _no_text_encoder_lora_notice():
                pipe.load_lora_weights(weights.parent, weight_name=weights.name)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise FluxClusterError(
                f"{weights}: the LoRA does not fit the model {pipeline} ({first_line(exc)})"
            ) from None
        if not any(".lora_A." in name for name, _ in pipe.transformer.named_parameters()):
            # diffusers skips keys that name no layer of the model with a warning, and loads nothing
            raise FluxClusterError(
                f"{weights}: the LoRA does not fit the model {pipeline} (no layer of it loaded)"
            )
        if fuse:
            pipe.fuse_lora()  # merged into the weights, as a LoRA is served: no extra work per step
        return
    from diffusers import FluxTransformer2DModel

    from flux_cluster.training.pretrained import check_headers

    _check_transformer_fits(pipe.transformer, weights, pipeline)
    check_headers(weights)
    try:
        with no_progress_bars(), held_transformers_logs():
            tuned = FluxTransformer2DModel.from_pretrained(weights, dtype=dtype, local_files_only=True)
    except (OSError, ValueError, KeyError, RuntimeError, MemoryError) as exc:
        raise _load_error(f"{weights}: cannot load it as a FLUX transformer", exc) from None
    pipe.transformer = tuned.to(device)


TEXT_ENCODER_LORA_NOTICE = re.compile(
    r"No LoRA keys associated to CLIPTextModel found with the prefix='text_encoder'\. This is safe to ignore"
)
"""diffusers' notice for a LoRA of the transformer alone (as flux-cluster trains them): FLUX's CLIP text
encoder gets none of it, which is as it should be."""


@contextmanager
def _no_text_encoder_lora_notice() -> Iterator[None]:
    """TEXT_ENCODER_LORA_NOTICE dropped while a LoRA loads; any other record of that logger still shows."""
    logger = logging.getLogger("diffusers.loaders.lora_base")

    def keep(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not TEXT_ENCODER_LORA_NOTICE.match(record.getMessage())

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def _check_transformer_fits(base: "torch.nn.Module", weights: Path, pipeline: Path) -> None:
    """A fine-tuned transformer folder of the same model: the shapes the pipeline's encoders feed it."""
    config = read_transformer_config(weights)
    keys = ("in_channels", "joint_attention_dim", "pooled_projection_dim", "guidance_embeds")
    differ = [k for k in keys if config.get(k) != base.config.get(k)]  # type: ignore[operator]
    if differ:
        raise FluxClusterError(
            f"{weights}: the transformer does not fit the model {pipeline} ({', '.join(differ)} differ)"
        )


def _check_lora_fits(transformer: "torch.nn.Module", weights: Path, pipeline: Path) -> None:
    """Every layer a diffusers-format LoRA adapts exists in the transformer with the LoRA's shapes: checked
    from the file's header before anything is generated (peft's own error comes after the base model ran,
    as a table of every mismatch). Other formats (kohya, ...) are left to diffusers' converters."""
    from flux_cluster.training.model import read_lora

    shapes = {key: list(tensor.shape) for key, tensor in read_lora(weights).items()}
    for key, a_shape in shapes.items():
        if not (key.startswith("transformer.") and key.endswith(".lora_A.weight")):
            continue
        layer = key.removeprefix("transformer.").removesuffix(".lora_A.weight")
        b_shape = shapes.get(f"transformer.{layer}.lora_B.weight")
        try:
            module = transformer.get_submodule(layer)
        except AttributeError:
            module = None
        in_features, out_features = (
            getattr(module, "in_features", None),
            getattr(module, "out_features", None),
        )
        fits = b_shape is not None and len(a_shape) == len(b_shape) == 2 and a_shape[0] == b_shape[1]
        if module is None or not fits or (a_shape[1], b_shape[0]) != (in_features, out_features):  # type: ignore[index]
            has = "no such layer" if module is None else f"the layer is {in_features} -> {out_features}"
            raise FluxClusterError(
                printable(
                    f"{weights}: the LoRA does not fit the model {pipeline}: {layer[:200]}: A {a_shape}, "
                    f"B {b_shape or []}, {has}"
                )
            )


def output_paths(target: Target, output: Path | None, runs_root: Path) -> tuple[Path, Path]:
    """A run's results/eval_<k>.json (k fixed when written), else --output (default
    runs/evaluate/<time>-<target name>/eval.json, never the working folder); the grid beside it."""
    if target.run_dir is not None:
        if output is not None:
            raise FluxClusterError(
                f"--output: TARGET {target.path} is a run directory, whose results/ gets eval_<k>.json"
            )
        from flux_cluster.rundir import eval_file

        json_path = eval_file(target.run_dir, "{k}")
    else:
        json_path = (output or default_output(target, runs_root)).absolute()
        if json_path.suffix != ".json" or json_path.is_dir():
            raise FluxClusterError(f"--output {output}: expected a file name ending in .json")
    return json_path, json_path.with_name(grid_name(json_path.name))


def default_output(target: Target, runs_root: Path) -> Path:
    """RUNS_ROOT/evaluate/<time>-<target name>/eval.json (the caller's runs folder: runs/, or
    $FLUX_CLUSTER_RUNS)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", target.path.absolute().name.removesuffix(".safetensors"))
    return runs_root / "evaluate" / f"{time.strftime('%Y%m%d-%H%M%S')}-{name or 'model'}" / "eval.json"


def _write(
    document: dict[str, Any],
    png: bytes,
    json_path: Path,
    grid_path: Path,
    columns: "Sequence[tuple[str, Sequence[Image]]]" = (),
) -> tuple[Path, Path]:
    """The full-size images and the grid first, then the JSON naming them, each atomically. In a run, k is
    the first index free for both files; the grid is linked into place without replacing anything, so two
    evaluations finishing at once never take the same k."""
    import shutil

    from flux_cluster.atomic import write_atomic

    folder = json_path.parent
    staged = folder / f".eval-images.{os.getpid()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staged, ignore_errors=True)
        save_images(columns, staged)
        if "{k}" not in json_path.name:
            _replace_folder(staged, folder / images_dir(grid_path.name))
            write_atomic(grid_path, png)
            write_atomic(json_path, _dumps({**document, "grid": grid_path.name}))
            return json_path, grid_path
        tmp = folder / f".eval-grid.{os.getpid()}.tmp"
        write_atomic(tmp, png)
        try:
            k = 0
            while True:
                json_k = folder / json_path.name.format(k=k)
                grid_k = folder / grid_path.name.format(k=k)
                if not json_k.exists():
                    try:
                        os.link(tmp, grid_k)
                        break
                    except FileExistsError:
                        pass
                k += 1
        finally:
            tmp.unlink(missing_ok=True)
        _replace_folder(staged, folder / images_dir(grid_k.name))
        write_atomic(json_k, _dumps({**document, "grid": grid_k.name}))
    except OSError as exc:
        raise write_error(folder, exc) from exc
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return json_k, grid_k


def _replace_folder(staged: Path, final: Path) -> None:
    """staged renamed to final; an earlier final (a left-over, or the same --output again) goes after."""
    import shutil

    old = final.with_name(f".{final.name}.old.{os.getpid()}")
    if final.exists():
        final.rename(old)
    staged.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _dumps(document: dict[str, Any]) -> str:
    """Strict JSON: a figure that is not finite (a diverged model's NaN loss) is written as null."""
    from flux_cluster.atomic import finite_for_json

    return json.dumps(finite_for_json(document), indent=1, allow_nan=False) + "\n"
