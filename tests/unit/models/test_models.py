"""The tiny random-init FLUX pipeline (flux_cluster/models/tiny.py) loaded by diffusers itself, and the
FLUX encoders that read a pipeline folder (flux_cluster/data/prep/encoders.py). All in-process, on one shared
folder."""

import json
import logging
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from cli_errors import error_line
from diffusers import FluxPipeline
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.config.workload import ModelArgs, load_workload
from flux_cluster.data.prep.encoders import ENCODER_PARTS, FluxEncoders, model_fingerprint
from flux_cluster.errors import FluxClusterError
from flux_cluster.models.tiny import write_tiny_pipeline

CAPTIONS = ["a red cube on a table", "", "Ünïcode, digits 123 and a much longer caption than the others"]


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _linked_copy(pipeline: Path, folder: Path, real: tuple[str, ...] = ()) -> Path:
    """A pipeline folder of links to pipeline's parts; the parts in real are copied, to be edited."""
    folder.mkdir()
    for part in pipeline.iterdir():
        if part.name in real:
            (shutil.copytree if part.is_dir() else shutil.copy)(part, folder / part.name)
        else:
            (folder / part.name).symlink_to(part)
    return folder


def _generate(pipe: FluxPipeline, **kwargs: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    out = pipe(
        "a cat", height=64, width=64, num_inference_steps=2, output_type="pt", generator=generator, **kwargs
    )
    return out.images


def test_tiny_schnell_pipeline_loads_and_generates(tiny_pipeline: Path) -> None:
    pipe = FluxPipeline.from_pretrained(tiny_pipeline, local_files_only=True)
    assert ModelArgs.of(pipe.transformer.config) == load_workload("flux1")[0].models["tiny"]
    assert pipe.scheduler.config.shift == 1.0 and not pipe.scheduler.config.use_dynamic_shifting
    # byte-level BPE read back from vocab.json: <|startoftext|> a</w> c a t</w> <|endoftext|>; T5 ends in </s>
    assert pipe.tokenizer("a cat").input_ids == [512, ord("a") + 256, ord("c"), ord("a"), ord("t") + 256, 513]
    assert pipe.tokenizer_2("a cat").input_ids[-1] == 1
    images = _generate(pipe, guidance_scale=0.0, max_sequence_length=32)
    assert images.shape == (1, 3, 64, 64) and torch.isfinite(images).all()


def test_tiny_dev_pipeline_takes_guidance(tmp_path: Path) -> None:
    out = write_tiny_pipeline(tmp_path / "dev", variant="dev", seed=1)
    pipe = FluxPipeline.from_pretrained(out, local_files_only=True)
    preset = load_workload("flux1")[0].models["tiny"]
    assert ModelArgs.of(pipe.transformer.config) == preset.model_copy(update={"guidance_embeds": True})
    assert pipe.scheduler.config.use_dynamic_shifting
    # the guidance value reaches the transformer's guidance embedder: another value, another image
    low, high = (_generate(pipe, guidance_scale=g, max_sequence_length=32) for g in (1.0, 7.0))
    assert low.shape == (1, 3, 64, 64) and torch.isfinite(low).all() and not torch.equal(low, high)


def test_tiny_pipeline_same_seed_same_bytes(tiny_pipeline: Path, tmp_path: Path) -> None:
    rng = torch.get_rng_state()
    again = write_tiny_pipeline(tmp_path / "again", seed=0)
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's random stream is left alone
    assert _files(again) == _files(tiny_pipeline)
    other = _files(write_tiny_pipeline(tmp_path / "other", seed=1))
    weights = [name for name in other if name.endswith(".safetensors")]
    assert len(weights) == 5 and all(other[name] != _files(again)[name] for name in weights)


def test_a_pipeline_at_the_proxy_width_has_encoders_as_wide_as_its_transformer() -> None:
    """write_tiny_pipeline(preset='proxy') (gpu_check.sh's inference latency at FLUX's width): the
    transformer is the preset's, and T5's and CLIP's outputs are as wide as its text inputs (built on the
    meta device: 2.5B parameters, nothing allocated)."""
    from flux_cluster.models.tiny import _components

    proxy = load_workload("flux1")[0].models["proxy"]
    with torch.device("meta"):
        parts = _components("schnell", "proxy")
    assert ModelArgs.of(parts["transformer"].config) == proxy
    assert parts["text_encoder_2"].config.d_model == proxy.joint_attention_dim == 4096
    assert parts["text_encoder"].config.hidden_size == proxy.pooled_projection_dim == 768


def test_models_tiny_cli(cli: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    result = cli.invoke(app, ["models", "tiny", str(out), "--variant", "dev", "--seed", "2"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines() == [
        f"wrote a tiny random-init FLUX.1-dev pipeline (seed 2) to {out}"
    ]
    assert json.loads((out / "transformer" / "config.json").read_text())["guidance_embeds"] is True
    written = _files(out)

    line = error_line(cli.invoke(app, ["models", "tiny", str(out)]))
    assert line == f"error: {out}: folder is not empty: expected a new or empty folder (--force replaces it)"
    assert _files(out) == written  # refused means untouched

    (out / "stale.txt").write_text("from an earlier run")
    result = cli.invoke(app, ["models", "tiny", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert not (out / "stale.txt").exists()
    assert json.loads((out / "transformer" / "config.json").read_text())["guidance_embeds"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]  # no temporary siblings left behind

    (tmp_path / "a-file").write_text("")
    assert "exists and is not a folder" in error_line(
        cli.invoke(app, ["models", "tiny", str(tmp_path / "a-file")])
    )


KNOWN_NOTICES = {
    "torchao": "Failed to load /venv/lib/python3.11/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-"
    "linux-gnu.so: Could not load this library: /venv/lib/python3.11/site-packages/torchao/_C_mxfp8.cpython"
    "-310-x86_64-linux-gnu.so",
    "torch.utils._pytree": "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by "
    "torch.compile as an opaque value type. Calling register_constant() on Enum subclasses is deprecated",
    "diffusers.quantizers.torchao.torchao_quantizer": "Unable to import `torchao` Tensor objects. This may "
    "affect loading checkpoints serialized with `torchao`",
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward from kernels-community: No module "
    "named 'kernels'. Please make sure you already `pip install kernels` and the kernels >= 0.11.1",
    "transformers.utils.import_utils": "`CLIPImageProcessor` requires torchvision (not installed); falling "
    "back to `CLIPImageProcessorPil` for backward compatibility. Install torchvision to use the default "
    "backend",
}
"""What these libraries log, word for word, when `models tiny` or `data encode` imports them here."""


@pytest.mark.parametrize("logger", KNOWN_NOTICES)
def test_only_the_known_library_notices_are_silenced(logger: str) -> None:
    """flux_cluster.models.quiet drops each known import-time notice, and nothing else from its logger:
    another warning, or the same text as an error, still reaches the console."""
    import flux_cluster.models.quiet  # noqa: F401

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    log = logging.getLogger(logger)
    log.addHandler(handler)
    try:
        log.warning(KNOWN_NOTICES[logger])
        log.warning("Failed to load the weights: a notice of another kind")
        log.error(KNOWN_NOTICES[logger])
    finally:
        log.removeHandler(handler)
    assert [(r.levelname, r.getMessage()[:20]) for r in records] == [
        ("WARNING", "Failed to load the w"),
        ("ERROR", KNOWN_NOTICES[logger][:20]),
    ]


@pytest.fixture(scope="module")
def encoders(tiny_pipeline: Path) -> FluxEncoders:
    return FluxEncoders.load(tiny_pipeline, torch.device("cpu"))


def test_encoders_shapes(encoders: FluxEncoders) -> None:
    assert encoders.pipe.transformer is None  # FLUX's largest part is never loaded
    assert (encoders.t5_tokens, encoders.t5_dim, encoders.clip_dim) == (256, 32, 32)
    assert (encoders.latent_channels, encoders.downsample) == (16, 8)
    t5, clip = encoders.encode_captions(CAPTIONS)
    assert t5.shape == (3, 256, 32) and clip.shape == (3, 32)
    mean, logvar = encoders.encode_images(torch.rand(2, 3, 64, 48) * 2 - 1)
    assert mean.shape == logvar.shape == (2, 16, 8, 6)
    assert {t.dtype for t in (t5, clip, mean, logvar)} == {torch.float32}
    with pytest.raises(
        FluxClusterError, match=r"images of shape \[2, 3, 60, 48\]: expected .* multiples of 8"
    ):
        encoders.encode_images(torch.zeros(2, 3, 60, 48))


def test_encode_captions_is_flux_encode_prompt(encoders: FluxEncoders, tiny_pipeline: Path) -> None:
    pipe = FluxPipeline.from_pretrained(tiny_pipeline, local_files_only=True)
    with torch.no_grad():  # as FluxPipeline.__call__ runs it
        t5, clip, _ = pipe.encode_prompt(CAPTIONS, device=torch.device("cpu"), max_sequence_length=256)
    ours = encoders.encode_captions(CAPTIONS)
    assert torch.equal(ours[0], t5) and torch.equal(ours[1], clip)


def test_encoders_batching_does_not_change_results(encoders: FluxEncoders) -> None:
    pixels = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    mean, logvar = encoders.encode_images(pixels)
    for i in range(3):
        one_mean, one_logvar = encoders.encode_images(pixels[i : i + 1])
        torch.testing.assert_close(mean[i : i + 1], one_mean, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logvar[i : i + 1], one_logvar, atol=1e-5, rtol=1e-5)
    t5, clip = encoders.encode_captions(CAPTIONS)
    one_t5, one_clip = encoders.encode_captions(CAPTIONS[2:])
    torch.testing.assert_close(t5[2:], one_t5, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(clip[2:], one_clip, atol=1e-5, rtol=1e-5)


def test_encoders_load_without_transformer_and_fingerprint(tiny_pipeline: Path, tmp_path: Path) -> None:
    linked = _linked_copy(tiny_pipeline, tmp_path / "linked")
    (linked / "transformer").unlink()
    assert FluxEncoders.load(linked, torch.device("cpu")).pipe.transformer is None
    # the same files anywhere (here: links) give the same fingerprint; the transformer is not part of it
    assert model_fingerprint(linked) == model_fingerprint(tiny_pipeline)
    copy = _linked_copy(tiny_pipeline, tmp_path / "copy", real=("vae",))
    weights = copy / "vae" / "diffusion_pytorch_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 1  # one bit in the middle: unseen by design (only the ends are hashed)
    weights.write_bytes(bytes(data))
    assert model_fingerprint(copy) == model_fingerprint(tiny_pipeline)
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert model_fingerprint(copy) != model_fingerprint(tiny_pipeline)


def _remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


@pytest.fixture
def transformers_logs() -> Iterator[list[logging.LogRecord]]:
    """What transformers logs (its own handler writes to whatever stderr was when it was set up)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    library = logging.getLogger("transformers")
    library.addHandler(handler)
    yield records
    library.removeHandler(handler)


def test_encoders_load_keeps_library_warnings(
    tiny_pipeline: Path, tmp_path: Path, transformers_logs: list[logging.LogRecord]
) -> None:
    """Held back while loading, transformers' warnings still reach the user when the load works: here
    its report of checkpoint weights the configured model does not use."""
    folder = _linked_copy(tiny_pipeline, tmp_path / "pipe", real=("text_encoder",))
    config = folder / "text_encoder" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "num_hidden_layers": 1}))
    assert FluxEncoders.load(folder, torch.device("cpu")).pipe.text_encoder.config.num_hidden_layers == 1
    reports = [r.getMessage() for r in transformers_logs if "LOAD REPORT" in r.getMessage()]
    assert len(reports) == 1 and "CLIPTextModel" in reports[0] and "UNEXPECTED" in reports[0]


def _edit_vae(key: str, value: object) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / "vae" / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))

    return edit


BAD_FOLDERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "folder missing": (
        lambda f: shutil.rmtree(f),
        r"{f}: no such folder: expected a diffusers FLUX pipeline",
    ),
    "no model_index.json": (
        lambda f: (f / "model_index.json").unlink(),
        r"{f}/model_index.json: missing: expected a diffusers FLUX pipeline folder",
    ),
    **{
        f"no {part}": (
            lambda f, part=part: _remove(f / part),
            rf"{{f}}/{part}: missing: expected the pipeline's {part} subfolder",
        )
        for part in ENCODER_PARTS
    },
    "4-channel vae": (
        _edit_vae("latent_channels", 4),
        r"{f}/vae/config.json: latent_channels is 4, expected 16 \(FLUX's autoencoder\)",
    ),
    "other shift": (
        _edit_vae("shift_factor", None),
        r"{f}/vae/config.json: shift_factor is None, expected FLUX's 0.1159",
    ),
    "SD scale": (
        _edit_vae("scaling_factor", 0.18215),
        r"{f}/vae/config.json: scaling_factor is 0.18215, expected FLUX's 0.3611",
    ),
    "text encoder config not its weights": (
        lambda f: (f / "text_encoder" / "config.json").write_text(
            (f / "text_encoder" / "config.json").read_text().replace('"hidden_size": 32', '"hidden_size": 64')
        ),
        r"{f}: could not load the FLUX encoders \(CLIPTextModel in {f}/text_encoder: its weights do not fit "
        r"its config.json\)",
    ),
    "broken weights": (
        lambda f: (f / "vae" / "diffusion_pytorch_model.safetensors").write_bytes(b"not safetensors"),
        r"{f}: could not load the FLUX encoders \(\w+: .+\)",
    ),
}


@pytest.mark.parametrize("case", BAD_FOLDERS)
def test_encoders_bad_pipeline_folder_is_one_line(
    case: str,
    tiny_pipeline: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    transformers_logs: list[logging.LogRecord],
) -> None:
    edit, expected = BAD_FOLDERS[case]
    folder = _linked_copy(tiny_pipeline, tmp_path / "pipe", real=("vae", "text_encoder"))
    edit(folder)
    with pytest.raises(FluxClusterError) as raised:
        FluxEncoders.load(folder, torch.device("cpu"))
    message = str(raised.value)
    # nothing besides that line: no progress bars, no library report
    assert "\n" not in message and capsys.readouterr().err == "" and transformers_logs == []
    assert re.fullmatch(expected.format(f=re.escape(str(folder))) + ".*", message), message


def test_torchaos_invalid_escape_warnings_never_reach_a_user(tmp_path: Path) -> None:
    """Compiling a torchao source (no .pyc, as on the GPU image) warns of its invalid escapes."""
    import subprocess
    import sys

    (tmp_path / "torchao").mkdir()
    (tmp_path / "torchao" / "__init__.py").write_text('PATTERN = "a\\.b"\n')
    code = "import flux_cluster.models.quiet, torchao"
    env = {"PYTHONPATH": f"{tmp_path}:{Path.cwd()}", "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"}
    python = [sys.executable, "-W", "always", "-c"]  # 3.11 warns with an otherwise hidden DeprecationWarning
    shown = subprocess.run([*python, code], env=env, capture_output=True, text=True, check=True)
    assert "invalid escape sequence" not in shown.stderr
    plain = subprocess.run([*python, "import torchao"], env=env, capture_output=True, text=True)
    assert "invalid escape sequence" in plain.stderr  # the notice the filter drops
