"""A pretrained FLUX transformer from a folder we do not control (``train.pretrained_path``, ``models
quantize``'s source), read one safetensors tensor at a time by the checked reader (safetensors_stream.py)
for both fine-tuning modes, and the pre-quantized checkpoints ``flux-cluster models quantize`` writes.

Before any tensor is read the config.json's shapes are checked against sane bounds
(config/transformer_config.py); every tensor's header entry is checked against the file before it is
allocated; the model's weights must be floating point (a pre-quantized layer's stored bytes uint8, its
scales finite), and a failed allocation is reported as one, not as a file that does not fit.
"""

from collections.abc import Callable
from pathlib import Path

import torch

from flux_cluster.config.transformer_config import read_transformer_config
from flux_cluster.errors import FluxClusterError, allocation_failed
from flux_cluster.outside import OutsideFileError
from flux_cluster.safe_text import printable
from flux_cluster.training.quantized_base import (
    AS_READ,
    NF4_BLOCK,
    STORED,
    STORED_AS,
    companion,
    quantize_base,
    quantize_fp8,
    quantize_nf4,
    stored_state,
)
from flux_cluster.training.safetensors_stream import read_safetensors, transformer_files

QUANTIZED_WEIGHTS = "flux_cluster_quantized.safetensors"
"""A pre-quantized transformer's weights (beside its diffusers config.json): the quantized layers' stored
tensors under their module names, every other weight in bf16, the precision in the file's metadata."""


_EXPECTED = "expected the tensors written by flux-cluster models quantize"
SOURCE_KEY = "source"
"""The pre-quantized file's metadata key naming the checkpoint it was quantized from (evaluate/target.py's
QUANTIZED_SOURCE_KEY)."""


def _short(exc: BaseException) -> str:
    """An exception's message on one short line (torch's shape errors list every key)."""
    return " ".join(str(exc).split())[:300]


def _quantized_file(path: Path) -> Path | None:
    for folder in (path / "transformer", path):
        if (folder / QUANTIZED_WEIGHTS).is_file():
            return folder / QUANTIZED_WEIGHTS
    return None


def prequantized_precision(path: Path) -> str | None:
    """'fp8' or 'nf4' for a checkpoint ``save_quantized`` wrote (a pipeline or transformer folder), else
    None; a file that says neither is one FluxClusterError line."""
    file = _quantized_file(path)
    if file is None:
        return None
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), "pt") as weights:
            precision = (weights.metadata() or {}).get("base_precision")
    except (OSError, SafetensorError) as exc:
        raise FluxClusterError(
            f"{file}: not a readable safetensors file ({_short(exc)}); {_EXPECTED}"
        ) from None
    if precision not in ("fp8", "nf4"):
        shown = printable(repr(precision)[:60])
        raise FluxClusterError(
            f"{file}: metadata base_precision {shown}, expected 'fp8' or 'nf4' ({_EXPECTED})"
        )
    return precision


def save_quantized(source: Path, out: Path, precision: str) -> Path:
    """Write the transformer of the diffusers checkpoint ``source`` with its linear weights quantized as
    training quantizes them (fp8 or nf4), to the new folder ``out`` (``out/transformer/``): a quarter
    (nf4) or half (fp8) of bf16 on disk. ``train.pretrained_path`` takes it with the same base_precision."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from flux_cluster.models.tiny import publish_folder
    from flux_cluster.training.model import load_pretrained

    if precision not in ("fp8", "nf4"):
        raise FluxClusterError(f"--precision {precision!r}: expected fp8 or nf4")
    if out.exists():
        raise FluxClusterError(f"{out}: exists; choose a new folder")
    try:  # read a tensor at a time where it can be: a host that trains on the base can quantize it
        model = (load_streaming(source, precision) or load_pretrained(source)).requires_grad_(False)
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        raise FluxClusterError(
            f"{source}: not a loadable diffusers FLUX checkpoint ({_short(exc)})"
        ) from None
    quantize_base(model, precision, torch.bfloat16)

    def fill(folder: Path) -> None:
        (folder / "transformer").mkdir()
        state = {name: tensor.contiguous() for name, tensor in stored_state(model).items()}
        # the source: evaluate finds the pipeline a run on this checkpoint was tuned from (target.py)
        metadata = {"base_precision": precision, "block": str(NF4_BLOCK), SOURCE_KEY: str(source.absolute())}
        save_file(state, folder / "transformer" / QUANTIZED_WEIGHTS, metadata=metadata)
        model.save_config(folder / "transformer")  # type: ignore[operator]

    # a unique sibling renamed onto out, files made readable to teammates (safetensors writes 0600)
    return publish_folder(out, fill)


def _placeholder(linear: torch.nn.Module, precision: str, read: object) -> torch.nn.Parameter:
    """A linear layer's weight until quantize_base swaps the layer: float32 on the CPU as the real one
    would be (peft makes its adapters in the base weight's dtype), one NaN broadcast to the weight's shape
    (4 bytes; any use shows), carrying the weight as read."""
    shape = (linear.out_features, linear.in_features)
    weight = torch.nn.Parameter(torch.full((), float("nan")).expand(shape), requires_grad=False)
    setattr(weight, AS_READ, (precision, read))
    return weight


PRECISIONS = ("fp32", "bf16", "fp8", "nf4")
"""load_streaming's: 'fp32' every weight float32 and trainable (mode 'finetune'); the others a LoRA base
stored at train.base_precision."""


def load_streaming(path: Path, precision: str) -> torch.nn.Module | None:
    """The transformer of a diffusers checkpoint, read one tensor at a time. ``precision`` 'fp32' (mode
    'finetune'): every tensor float32, as from_pretrained gives it, each read straight into its place. A
    LoRA base stored at ``precision``: each linear weight kept as read (bf16), or quantized at once (fp8,
    nf4) and its full-precision tensor freed, behind a placeholder weight that ``quantize_base`` replaces
    after ``add_lora``; a rank holds the stored base plus one layer, not the float32 model (48 GB for
    FLUX.1's 12B parameters). Every other tensor is float32, as ``load_pretrained`` gives it; the bytes
    quantize_base then makes are the same. A pre-quantized checkpoint (``models quantize``) keeps its stored
    bytes. None when the checkpoint has no safetensors weights (it loads the old way). As from_pretrained:
    tensors the model does not have are ignored (one notice line); a missing, wrong-shaped or integer one, a
    damaged file or config.json, is one FluxClusterError line naming the file, checked before anything is
    quantized."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    opened = _open(path, precision)
    if opened is None:
        return None
    reader, files = opened
    _read(reader, files)
    return reader.finish(files[0])


def check_headers(path: Path) -> None:
    """load_streaming's checks of a checkpoint others read whole (evaluate's diffusers pipeline and
    fine-tuned transformer): its config.json's bounds, and every safetensors header entry against that
    config (shape, floating point), reading no tensor. One FluxClusterError line naming the file and key."""
    opened = _open(path, "fp32")
    if opened is not None:
        _read(*opened, headers_only=True)


def _open(path: Path, precision: str) -> tuple["_Reader", list[Path]] | None:
    """The reader of a checkpoint's safetensors files, over the model its checked config.json makes on the
    meta device; None when it has no safetensors weights."""
    from diffusers import FluxTransformer2DModel

    prequantized = _quantized_file(path)
    found = (prequantized.parent, [prequantized]) if prequantized else transformer_files(path)
    if found is None:
        return None
    folder, files = found
    expected = f"; {_EXPECTED}" if prequantized else ""
    try:
        with torch.device("meta"):
            model = FluxTransformer2DModel.from_config(read_transformer_config(folder))
    except FluxClusterError as exc:
        raise FluxClusterError(f"{exc}{expected}") from None
    except (OSError, ValueError, TypeError) as exc:
        written = f" flux-cluster models quantize writes beside {QUANTIZED_WEIGHTS}" if prequantized else ""
        raise FluxClusterError(
            f"{folder / 'config.json'}: not a FLUX transformer config ({_short(exc)}); expected the "
            f"config.json{written}"
        ) from None
    return _Reader(folder / "config.json", model, precision, prequantized is not None), files


def _read(reader: "_Reader", files: list[Path], headers_only: bool = False) -> None:
    """Every tensor of files into reader (headers_only: each header entry checked, none read)."""
    for file in files:
        wanted = reader.wanted(file)
        check = (lambda *entry, wanted=wanted: wanted(*entry) and False) if headers_only else wanted
        try:
            for key, tensor in read_safetensors(file, check):
                reader.add(file, key, tensor)
                del tensor  # the full-precision weight goes now, not at the next one
        except OutsideFileError as exc:
            raise FluxClusterError(f"{exc}{reader.expected}") from None
        except OSError as exc:
            raise FluxClusterError(
                f"{file}: cannot be read ({exc.strerror or exc}){reader.expected}"
            ) from None
        except (MemoryError, RuntimeError) as exc:
            if not allocation_failed(exc):
                raise
            raise FluxClusterError(
                f"{file}: out of host memory while reading it ({_short(exc)}); the model its config.json "
                "gives needs more than this process may allocate"
            ) from None


class _Reader:
    """load_streaming's state: each header entry checked against the model the config makes before it is
    allocated (``wanted``), each tensor read put in its place (``add``: a placeholder for a LoRA base's
    linear weights, a pre-quantized layer's pair of stored tensors)."""

    def __init__(self, config: Path, model: torch.nn.Module, precision: str, prequantized: bool) -> None:
        self.config, self.model, self.precision, self.prequantized = config, model, precision, prequantized
        self.modules = dict(model.named_modules())
        self.shapes = {key: tuple(value.shape) for key, value in model.state_dict().items()}  # the config's
        self.state: dict[str, torch.Tensor] = {}
        self.halves: dict[str, torch.Tensor] = {}  # a pre-quantized layer's first tensor, until the other
        self.unexpected: list[str] = []
        self.expected = f"; {_EXPECTED}" if prequantized else ""

    def wanted(self, file: Path) -> Callable[[str, torch.dtype, list[int]], bool]:
        """read_safetensors' check of each header entry of ``file``: its shape the config's and its dtype
        floating point (a pre-quantized layer's: its stored uint8 shape), else one line; tensors the model
        does not have are not read."""

        def check(key: str, dtype: torch.dtype, shape: list[int]) -> bool:
            prefix, _, kind = key.rpartition(".")
            if self.prequantized and kind in STORED_AS:
                linear = self.modules.get(prefix)
                if type(linear) is not torch.nn.Linear:
                    where = printable(key[:200])
                    raise FluxClusterError(
                        f"{file}: {where}: config.json has no linear layer there; {_EXPECTED}"
                    )
                expected, want = _stored_shapes(linear)[kind], torch.uint8
            elif key in self.shapes:
                expected, want = self.shapes[key], None
            else:  # from_pretrained ignores them too (with a warning)
                self.unexpected.append(key)
                return False
            if tuple(shape) != expected:
                raise FluxClusterError(
                    f"{file}: {printable(key[:200])}: shape {shape}, expected {list(expected)} "
                    f"(from {self.config}){self.expected}"
                )
            if (dtype != want) if want else not dtype.is_floating_point:
                raise FluxClusterError(
                    f"{file}: {printable(key[:200])}: {str(dtype).removeprefix('torch.')} values; expected "
                    f"{'uint8 bytes' if want else 'floating point (FLUX weights are bf16 or float32)'}"
                    f"{self.expected}"
                )
            return True

        return check

    def add(self, file: Path, key: str, tensor: torch.Tensor) -> None:
        """A tensor ``wanted`` let through, into the state the model is loaded from."""
        prefix, _, kind = key.rpartition(".")
        linear = self.modules.get(prefix)
        if self.prequantized and kind in STORED_AS:
            first = self.halves.pop(f"{prefix}.{companion(kind)}", None)
            if first is None:
                self.halves[key] = tensor
                return
            stored, index = STORED_AS[kind]
            pair = (tensor, first) if index == 0 else (first, tensor)
            self.state[f"{prefix}.weight"] = _prequantized_weight(
                file, prefix, linear, pair, stored, self.precision
            )
        elif (
            not self.prequantized
            and self.precision != "fp32"
            and kind == "weight"
            and type(linear) is torch.nn.Linear
            and (self.precision != "nf4" or linear.in_features % NF4_BLOCK == 0)
        ):
            read = _quantize_rows(tensor, self.precision) if self.precision != "bf16" else tensor
            self.state[key] = _placeholder(linear, self.precision, read)
        else:  # norms, biases, unquantized layers, a full fine-tune: float32 as from_pretrained makes them
            self.state[key] = tensor if self.prequantized else tensor.float()

    def finish(self, file: Path) -> torch.nn.Module:
        if self.halves:
            prefix, _, kind = next(iter(self.halves)).rpartition(".")
            names = printable(f"{prefix}.{kind} without {prefix}.{companion(kind)}"[:400])
            raise FluxClusterError(f"{file}: {names}; {_EXPECTED}")
        missing = [key for key in self.shapes if key not in self.state]
        if missing:
            raise FluxClusterError(
                f"{file}: {len(missing)} tensors of {self.config} missing ({_few(missing)}){self.expected}"
            )
        if self.unexpected and _first_rank():  # every rank reads the same file: one notice
            count = len(self.unexpected)
            print(f"note: {file}: {count} tensors the model does not have, ignored: {_few(self.unexpected)}")
        try:  # the meta parameters' requires_grad is kept: trainable unless add_lora freezes them
            self.model.load_state_dict(self.state, strict=True, assign=True)
        except RuntimeError as exc:
            raise FluxClusterError(
                f"{file}: does not fit its config.json ({_short(exc)}){self.expected}"
            ) from None
        return self.model.eval()  # as from_pretrained returns it


def _first_rank() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def _few(keys: list[str]) -> str:
    """The first few of many tensor names, printable, for a one-line message."""
    more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
    return ", ".join(printable(key[:200]) for key in keys[:3]) + more


_ROWS_AT_ONCE = 1 << 22
"""Weights quantized at once by ``_quantize_rows`` (their temporaries: ~16 bytes a weight)."""


def _quantize_rows(weight: torch.Tensor, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_fp8 or quantize_nf4 of ``weight`` (as bytes), a few rows at a time: a row's bytes depend on
    that row alone, so they are the same, and the temporaries are a few rows', not a whole layer's."""
    quantize = quantize_fp8 if precision == "fp8" else quantize_nf4
    parts = [quantize(rows) for rows in weight.split(max(1, _ROWS_AT_ONCE // weight.shape[1]))]
    return torch.cat([data.view(torch.uint8) for data, _ in parts]), torch.cat([scale for _, scale in parts])


def _stored_shapes(linear: torch.nn.Linear) -> dict[str, tuple[int, int]]:
    """The shapes of a linear layer's stored tensors, as ``models quantize`` writes them (uint8 bytes)."""
    rows, cols = linear.out_features, linear.in_features
    (fp8, fp8_scale), (nf4, nf4_absmax) = STORED["fp8"], STORED["nf4"]
    return {
        fp8: (rows, cols), fp8_scale: (rows, 4),
        nf4: (rows, cols // 2), nf4_absmax: (rows, cols // NF4_BLOCK * 4),
    }  # fmt: skip


def _prequantized_weight(
    file: Path,
    prefix: str,
    linear: torch.nn.Module | None,
    pair: tuple[torch.Tensor, torch.Tensor],
    kind: str,
    precision: str,
) -> torch.nn.Parameter:
    """The placeholder of a pre-quantized layer: its stored (data, scale) or (packed, absmax) bytes of
    ``kind`` as they are, after checking they fit the layer the config makes at ``precision`` and hold no
    NaN weight or scale (which quantizing never writes)."""
    data, scale = pair
    data_kind, scale_kind = STORED[kind]
    names = printable(f"{prefix}.{data_kind} and {prefix}.{scale_kind}"[:400])
    assert type(linear) is torch.nn.Linear  # the reader's header check
    shapes = _stored_shapes(linear)
    fits = (
        kind == precision
        and (tuple(data.shape), tuple(scale.shape)) == (shapes[data_kind], shapes[scale_kind])
        and (precision == "fp8" or linear.in_features % NF4_BLOCK == 0)
    )
    if not fits:
        raise FluxClusterError(
            f"{file}: {names} do not fit (shapes {list(data.shape)} and {list(scale.shape)} for a "
            f"{precision} layer of {linear.in_features} x {linear.out_features}); {_EXPECTED}"
        )
    scales = scale.view(torch.float32)
    nan_codes = precision == "fp8" and bool(((data & 0x7F) == 0x7F).any())  # e4m3fn's NaN bytes
    if nan_codes or not bool((torch.isfinite(scales) & (scales > 0)).all()):
        what = "NaN weights" if nan_codes else "scales that are not finite positive numbers"
        raise FluxClusterError(f"{file}: {names}: {what} (quantizing never writes them); {_EXPECTED}")
    return _placeholder(linear, precision, (data, scale))


def pretrained_base(path: Path, precision: str, mode: str) -> torch.nn.Module | None:
    """The model of ``train.pretrained_path`` read by ``load_streaming`` (never whole in float32 for
    'lora'; float32 and trainable for 'finetune'): one reader, so both modes refuse a damaged file in one
    line. A pre-quantized checkpoint only for LoRA with the base_precision it was quantized at (one
    FluxClusterError line otherwise). None where the plain load applies (a checkpoint without safetensors
    weights, which loads the old way)."""
    stored = prequantized_precision(path)
    if stored is not None and (mode != "lora" or precision != stored):
        raise FluxClusterError(
            f"train.pretrained_path {path}: a base quantized to {stored}: it trains LoRA adapters with "
            f"train.base_precision {stored} (got mode {mode!r}, base_precision {precision!r})"
        )
    return load_streaming(path, precision if mode == "lora" else "fp32")
