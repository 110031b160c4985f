"""The FLUX transformer (diffusers ``FluxTransformer2DModel``): building it, feeding it, LoRA adapters.

Latents [B, 16, H, W] are packed 2x2 into H/2 * W/2 tokens of 64 channels, as FLUX does; image tokens
carry (0, row, column) position ids, text tokens zeros. diffusers scales the timestep t in [0, 1] by 1000.
"""

from pathlib import Path

import flux_cluster.models.quiet  # noqa: F401  (before diffusers: quiets torchao's import warnings)

# isort: split
import torch
from diffusers import FluxTransformer2DModel

from flux_cluster.config.workload import ModelArgs
from flux_cluster.safe_text import printable

META_INIT_PARAMS = 2_000_000_000
"""Models larger than this are created on the meta device and initialised after sharding, so no rank
ever holds a full copy (flux-schnell: 11.9B parameters, 48 GB in float32)."""


def build_model(
    args: ModelArgs, pretrained_path: str | None = None, meta_init: bool | None = None
) -> FluxTransformer2DModel:
    """Random init (the benchmark) or weights from a local diffusers folder (fine-tuning). Small random
    models are built on the CPU with the current RNG, so every rank builds identical weights; large ones
    on the meta device (call ``init_weights`` after ``to_empty``); ``meta_init`` forces either way."""
    if pretrained_path:
        return load_pretrained(Path(pretrained_path))
    kwargs = args.model_dump()
    with torch.device("meta"):
        model = FluxTransformer2DModel(**kwargs)
    if not (meta_init if meta_init is not None else parameter_count(model) > META_INIT_PARAMS):
        model = FluxTransformer2DModel(**kwargs)
    return model


def load_pretrained(path: Path) -> FluxTransformer2DModel:
    """diffusers' own loading of a checkpoint (a transformer folder or a pipeline folder), whole in float32:
    its config.json's shapes checked first (one FluxClusterError line, as a failed allocation is).
    Training reads safetensors checkpoints with pretrained.load_streaming instead."""
    from flux_cluster.config.transformer_config import read_transformer_config
    from flux_cluster.errors import FluxClusterError, allocation_failed

    read_transformer_config(path)
    subfolder = "transformer" if (path / "transformer" / "config.json").is_file() else None
    try:
        return FluxTransformer2DModel.from_pretrained(
            path, subfolder=subfolder, torch_dtype=torch.float32, local_files_only=True
        )
    except (MemoryError, RuntimeError) as exc:
        if not allocation_failed(exc):
            raise
        raise FluxClusterError(f"{path}: out of host memory loading the transformer ({exc})"[:400]) from None


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def is_on_meta(model: torch.nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


@torch.no_grad()
def init_weights(model: torch.nn.Module) -> None:
    """Initialise materialised (``to_empty``) weights the way their modules' constructors do: FLUX holds
    only Linear and RMSNorm parameters, both of which can reset themselves."""
    for module in model.modules():
        if list(module.parameters(recurse=False)):
            reset = getattr(module, "reset_parameters", None)
            if reset is None:
                raise TypeError(f"{type(module).__name__} has parameters but no reset_parameters()")
            reset()


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, H/2 * W/2, C * 4]."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(tokens: torch.Tensor, channels: int, height: int, width: int) -> torch.Tensor:
    """The inverse of pack_latents."""
    b = tokens.shape[0]
    x = tokens.view(b, height // 2, width // 2, channels, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, channels, height, width)


def position_ids(height: int, width: int, text_tokens: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(img_ids [H/2 * W/2, 3], txt_ids [S, 3]) for the rotary embeddings."""
    rows = torch.arange(height // 2, device=device).repeat_interleave(width // 2)
    cols = torch.arange(width // 2, device=device).repeat(height // 2)
    img_ids = torch.stack([torch.zeros_like(rows), rows, cols], dim=1).float()
    return img_ids, torch.zeros(text_tokens, 3, device=device)


def predict_velocity(
    model: torch.nn.Module,
    x_t: torch.Tensor,
    t: torch.Tensor,
    t5: torch.Tensor,
    clip: torch.Tensor,
    dtype: torch.dtype,
    guidance_scale: float = 3.5,
    extra: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The model's velocity prediction for latents x_t [B, C, H, W] at times t [B], as [B, C, H, W].
    Guidance-distilled models (FLUX.1-dev) also get ``guidance_scale``. ``extra``: (tokens [B, M, 64], ids
    [M, 3]) appended after the target's image tokens, their outputs dropped: FLUX Kontext's control image
    (training/kontext.py's control_tokens)."""
    b, c, h, w = x_t.shape
    img_ids, txt_ids = position_ids(h, w, t5.shape[1], x_t.device)
    distilled = model.config.guidance_embeds  # type: ignore[union-attr]
    guidance = torch.full((b,), guidance_scale, device=x_t.device, dtype=dtype) if distilled else None
    tokens = pack_latents(x_t).to(dtype)
    if extra is not None:
        tokens = torch.cat([tokens, extra[0].to(tokens.device, dtype)], dim=1)
        img_ids = torch.cat([img_ids, extra[1].to(img_ids.device, img_ids.dtype)], dim=0)
    out = model(
        hidden_states=tokens,
        encoder_hidden_states=t5.to(dtype),
        pooled_projections=clip.to(dtype),
        timestep=t.to(dtype),
        img_ids=img_ids,
        txt_ids=txt_ids,
        guidance=guidance,
        return_dict=False,
    )[0]
    return unpack_latents(out[:, : (h // 2) * (w // 2)], c, h, w)  # the target's tokens only


# ---- LoRA (peft): adapters on a frozen base, saved in diffusers' LoRA format.

LORA_FILE = "pytorch_lora_weights.safetensors"
LORA_ADAPTER = "default"
"""peft's name for the one adapter add_lora makes; it appears in parameter names, not in saved keys."""


def add_lora(model: FluxTransformer2DModel, rank: int, alpha: float, targets: list[str]) -> None:
    """Adapters on the target modules; every other parameter is frozen."""
    from peft import LoraConfig

    model.requires_grad_(False)
    model.add_adapter(
        LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights="gaussian")
    )


def lora_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights in diffusers' key format ('<module>.lora_A.weight'), gathered from FSDP shards
    (a collective: every rank calls it; only values on rank 0 matter). Keys are made from the parameter
    names directly: peft's own helper matches its module names, which checkpoint-wrapped blocks change."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX

    full = {}
    for name, param in model.named_parameters():
        if "lora_" in name:
            value = param.full_tensor() if hasattr(param, "full_tensor") else param
            key = name.replace(_CHECKPOINT_PREFIX, "").replace(f".{LORA_ADAPTER}.", ".")
            full[key] = value.detach().to("cpu", torch.float32).contiguous()
    return full


def lora_metadata(model: torch.nn.Module) -> dict:
    """The adapter's LoraConfig (rank, alpha, targets), stored in the file so loaders scale it right."""
    return model.peft_config[LORA_ADAPTER].to_dict()  # type: ignore[index, union-attr, operator]


def save_lora(state_dict: dict[str, torch.Tensor], metadata: dict, folder: Path) -> Path:
    """Write the adapter as FluxPipeline.load_lora_weights reads it (keys 'transformer.<module>...')."""
    from diffusers.loaders.lora_pipeline import FluxLoraLoaderMixin

    folder.mkdir(parents=True, exist_ok=True)
    FluxLoraLoaderMixin.save_lora_weights(
        folder,
        transformer_lora_layers=state_dict,
        transformer_lora_adapter_metadata=metadata,
        weight_name=LORA_FILE,
        safe_serialization=True,
    )
    return folder / LORA_FILE


def load_lora_init(model: torch.nn.Module, path: Path, rank: int, targets: list[str]) -> None:
    """Start the adapters add_lora made from a diffusers LoRA file (as save_lora writes it); call it
    before parallelize. The file's rank and adapted modules must be what the config asks for."""
    from flux_cluster.errors import FluxClusterError

    where = f"train.lora_init: {printable(str(path))}"
    try:
        tensors = read_lora(path)
    except FluxClusterError as exc:
        raise FluxClusterError(f"train.lora_init: {exc}") from None
    adapters: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        module, _, part = key.removeprefix("transformer.").rpartition(".lora_")
        if module and part in ("A.weight", "B.weight"):
            adapters.setdefault(module, {})[part[0]] = value
    if not adapters:
        raise FluxClusterError(f"{where}: no LoRA weights in it (keys 'transformer.<module>.lora_A.weight')")
    ranks = sorted({int(pair["A"].shape[0]) for pair in adapters.values() if "A" in pair})
    found = sorted({_target_of(module, targets) for module in adapters})
    if ranks != [rank] or found != sorted(set(targets)):
        raise FluxClusterError(
            f"{where}: rank {', '.join(map(str, ranks)) or '?'} and targets {found} in the file; "
            f"train.lora_rank {rank} and train.lora_targets {sorted(set(targets))} configured"
        )
    params = dict(model.named_parameters())
    adapted = {name.rsplit(".lora_A.", 1)[0] for name in params if ".lora_A." in name}
    missing, extra = sorted(adapted - set(adapters)), sorted(set(adapters) - adapted)
    if missing or extra or any(len(pair) != 2 for pair in adapters.values()):
        incomplete = sorted(module for module, pair in adapters.items() if len(pair) != 2)
        raise FluxClusterError(
            f"{where}: does not fit the model: no adapter for {missing[:3]}, modules the model lacks "
            f"{extra[:3]}, lora_A or lora_B missing for {incomplete[:3]}"
        )
    pairs = [
        (params[f"{module}.lora_{part}.{LORA_ADAPTER}.weight"], value, f"{module}.lora_{part}.weight")
        for module, pair in adapters.items()
        for part, value in pair.items()
    ]
    for param, value, name in pairs:  # all checked before any is loaded
        if param.shape != value.shape:
            raise FluxClusterError(
                f"{where}: {name} is {list(value.shape)} in the file; the model's is {list(param.shape)}"
            )
    with torch.no_grad():
        for param, value, _ in pairs:
            param.copy_(value)


def read_lora(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a LoRA safetensors file we do not control, by the checked streaming reader (every
    header entry against the file before allocating); each must hold finite floating-point numbers (an
    int32 or NaN adapter would train or serve garbage silently). One FluxClusterError line naming the file
    and the tensor otherwise."""
    from flux_cluster.errors import FluxClusterError
    from flux_cluster.outside import OutsideFileError
    from flux_cluster.training.safetensors_stream import read_safetensors

    tensors = {}
    try:
        for name, tensor in read_safetensors(path):
            shown = f"{printable(str(path))}: {printable(name[:200])}"
            if not tensor.is_floating_point():
                kind = str(tensor.dtype).removeprefix("torch.")
                raise FluxClusterError(f"{shown}: {kind} values; expected floating point (LoRA weights)")
            if not bool(torch.isfinite(tensor).all()):
                raise FluxClusterError(f"{shown}: NaN or infinite values; expected finite LoRA weights")
            tensors[name] = tensor
    except OutsideFileError as exc:
        raise FluxClusterError(printable(str(exc))) from None
    except OSError as exc:
        raise FluxClusterError(f"{printable(str(path))}: cannot be read ({exc.strerror or exc})") from None
    return tensors


def _target_of(module: str, targets: list[str]) -> str:
    """The configured target (peft's suffix match) a module name answers to, else its own last name."""
    for target in targets:
        if module == target or module.endswith(f".{target}"):
            return target
    parts = module.split(".")
    return ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]
