"""A FLUX transformer's limits: the image sizes and text lengths it takes, and its config.json from a folder
we do not control (``train.pretrained_path``, a pipeline
evaluate loads, a fine-tuned transformer), checked against sane bounds before anything is built from it.

diffusers builds whatever shape a config.json gives: ``num_layers: 1000000`` makes a million blocks (over
6.9 GB of module objects per rank, even on the meta device), a width of 2**40 fails deep in torch. Here
each shape key is a whole number within bounds far above FLUX.1's (FLUX.1 [dev] and [schnell]: 19 + 38
blocks, 24 heads of 128, T5 4096, CLIP 768), and the model they make is at most MAX_PARAMETERS. No torch.
"""

import os
from pathlib import Path
from typing import Any

from flux_cluster.errors import FluxClusterError
from flux_cluster.outside import OutsideFileError, read_json_object
from flux_cluster.safe_text import printable

CONFIG_FILE = "config.json"
MAX_CONFIG_BYTES = 1024 * 1024
"""A diffusers config.json is about 500 bytes."""
MAX_PARAMETERS = 100_000_000_000
"""About 8x FLUX.1's 11.9B parameters: the largest model a config may describe."""

MAX_T5_TOKENS = 512
"""FLUX.1's text length: T5 tokens per prompt (FLUX.1 [dev] and diffusers' limit; [schnell]: 256)."""
RESOLUTION_STEP = 16
"""A FLUX image side is a multiple of this: the VAE's 8x downsampling, then 2x2 latent patches."""
MAX_RESOLUTION = 4096
"""The largest square side evaluate and data encode take (FLUX.1 is trained up to about 2 megapixels)."""


def resolution_problem(value: int) -> str | None:
    """What is wrong with an image side (a --resolution), or None."""
    if RESOLUTION_STEP <= value <= MAX_RESOLUTION and value % RESOLUTION_STEP == 0:
        return None
    return (
        f"expected a multiple of {RESOLUTION_STEP} from {RESOLUTION_STEP} to {MAX_RESOLUTION:,} (FLUX's "
        f"latent patches are {RESOLUTION_STEP} pixels; FLUX.1 is trained up to about 2 megapixels)"
    )


def token_problem(value: int) -> str | None:
    """What is wrong with a T5 token count (a --max-sequence-length), or None."""
    if 1 <= value <= MAX_T5_TOKENS:
        return None
    return f"expected 1 to {MAX_T5_TOKENS} (T5's limit in FLUX.1 [dev]; [schnell] is trained at 256)"


_WHOLE = {  # key: (least, most, FLUX.1's value)
    "patch_size": (1, 64, 1),
    "in_channels": (1, 4096, 64),
    "out_channels": (1, 4096, None),
    "num_layers": (0, 1024, 19),
    "num_single_layers": (0, 1024, 38),
    "attention_head_dim": (2, 1024, 128),
    "num_attention_heads": (1, 1024, 24),
    "joint_attention_dim": (1, 65536, 4096),
    "pooled_projection_dim": (1, 65536, 768),
}
"""FluxTransformer2DModel's integer arguments (out_channels may also be null: in_channels)."""
MAX_WIDTH = 65536
"""attention_head_dim x num_attention_heads (FLUX.1: 3072)."""
_ROPE = (16, 56, 56)
"""FLUX.1's axes_dims_rope: three even sizes that sum to attention_head_dim."""


def config_path(folder: Path) -> Path:
    """The transformer's config.json of a pipeline folder (transformer/) or of a transformer folder."""
    nested = folder / "transformer" / CONFIG_FILE
    return nested if os.path.lexists(nested) else folder / CONFIG_FILE


def read_transformer_config(folder: Path) -> dict[str, Any]:
    """The checked config.json of ``folder`` (a pipeline or a transformer folder): one FluxClusterError line
    naming the file and key when it is missing, not a bounded regular JSON object, or gives a shape out of
    bounds. A hub snapshot's symlink is followed to its blob."""
    path = config_path(folder)
    if not os.path.lexists(path):  # anything else there (a FIFO, a folder) is read_json_object's line
        raise FluxClusterError(
            f"{printable(str(folder))}: no diffusers config.json (or transformer/config.json)"
        )
    try:
        config = read_json_object(os.path.realpath(path), limit=MAX_CONFIG_BYTES)
    except OutsideFileError as exc:
        raise FluxClusterError(printable(str(exc))) from None
    check_transformer_config(config, printable(str(path)))
    return config


def check_transformer_config(config: dict[str, Any], where: str) -> None:
    """The shape keys of a FluxTransformer2DModel config (absent ones take diffusers' defaults, FLUX.1's)
    within bounds; ``where`` names the file in the one-line error."""
    shape = {key: config.get(key, flux) for key, (_, _, flux) in _WHOLE.items()}
    for key, (least, most, flux) in _WHOLE.items():
        value = shape[key]
        if value is None and key == "out_channels":
            continue
        if type(value) is not int or not least <= value <= most:
            shown = printable(repr(value)[:60])
            raise FluxClusterError(
                f"{where}: {key} {shown}: expected a whole number from {least} to {most:,} (FLUX.1: {flux})"
            )
    width = shape["attention_head_dim"] * shape["num_attention_heads"]
    if width > MAX_WIDTH:
        raise FluxClusterError(
            f"{where}: attention_head_dim x num_attention_heads is {width:,}: expected at most {MAX_WIDTH:,} "
            "(FLUX.1: 128 x 24 = 3,072)"
        )
    guidance = config.get("guidance_embeds", False)
    if not isinstance(guidance, bool):
        raise FluxClusterError(
            f"{where}: guidance_embeds {printable(repr(guidance)[:60])}: expected true or false"
        )
    rope = config.get("axes_dims_rope", list(_ROPE))
    if (
        not isinstance(rope, list | tuple)
        or len(rope) != 3
        or not all(type(n) is int and n >= 0 and n % 2 == 0 for n in rope)
        or sum(rope) != shape["attention_head_dim"]
    ):
        raise FluxClusterError(
            f"{where}: axes_dims_rope {printable(repr(rope)[:60])}: expected three even sizes that sum to "
            f"attention_head_dim {shape['attention_head_dim']} (FLUX.1: {list(_ROPE)} for 128)"
        )
    parameters = estimated_parameters(shape, width)
    if parameters > MAX_PARAMETERS:
        raise FluxClusterError(
            f"{where}: a model of about {parameters / 1e9:,.0f}B parameters; expected at most "
            f"{MAX_PARAMETERS / 1e9:,.0f}B (FLUX.1: 11.9B)"
        )


def estimated_parameters(shape: dict[str, Any], width: int) -> int:
    """The weights of the model a config makes, biases and norms aside: a double-stream block 36 d^2 (two
    streams of q, k, v, out and a 4x MLP, and their adaLN modulation), a single-stream one 15 d^2, and the
    embedders and head (training/flops.py counts the same matmuls)."""
    d = width
    blocks = d * d * (36 * shape["num_layers"] + 15 * shape["num_single_layers"])
    out = shape["out_channels"] or shape["in_channels"]
    embedders = d * (shape["in_channels"] + shape["joint_attention_dim"] + shape["pooled_projection_dim"])
    return blocks + embedders + d * (256 + out) + 4 * d * d
