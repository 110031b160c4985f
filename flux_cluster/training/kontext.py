"""FLUX Kontext (image editing) training: the control image as extra image tokens.

As ``FluxKontextPipeline`` runs it: the control image's latents (the autoencoder's mode, shifted and
scaled) are packed 2x2 like the target's and appended after the target tokens; their position ids are the
target's layout with the first id set to 1 instead of 0, so attention tells the two images apart. The
model's output for the control tokens is dropped: the loss is on the target tokens only. An edit-pair
dataset (``data encode`` of a control_images/ folder) gives batches with ``control``; text-to-image
batches have none and train as before.
"""

from collections.abc import Callable

import torch

from flux_cluster.models.latents import LATENT_SCALE, LATENT_SHIFT
from flux_cluster.training.model import pack_latents, position_ids, predict_velocity

CONTROL_ID = 1.0
"""ids[..., 0] of the control tokens (diffusers' FluxKontextPipeline.prepare_latents); the target's is 0."""


def control_latents(control_mean: torch.Tensor) -> torch.Tensor:
    """The control image's latents as Kontext conditions on them: the mode (the mean), shifted and scaled."""
    return (control_mean.float() - LATENT_SHIFT) * LATENT_SCALE


def control_ids(height: int, width: int, device: torch.device) -> torch.Tensor:
    """Position ids [H/2 * W/2, 3] of a control image's tokens: (1, row, column)."""
    ids, _ = position_ids(height, width, 0, device)
    ids[:, 0] = CONTROL_ID
    return ids


def control_tokens(control_mean: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(tokens [B, H/2 * W/2, 64], ids [H/2 * W/2, 3]) of a batch of control latent means [B, 16, H, W],
    for predict_velocity's ``extra``; None for a batch without control (text-to-image)."""
    if control_mean is None:
        return None
    latents = control_latents(control_mean)
    return pack_latents(latents), control_ids(latents.shape[-2], latents.shape[-1], latents.device)


def velocity_predictor(
    model: torch.nn.Module, dtype: torch.dtype, guidance_scale: float
) -> Callable[..., torch.Tensor]:
    """validation_loss's prediction: (x_t, t, t5, clip, control=None) -> velocity, an edit pair's control
    latents as Kontext's extra tokens (training's evaluation and ``evaluate``'s val loss alike)."""

    def predict(x_t, t, t5, clip, control=None):  # type: ignore[no-untyped-def]
        return predict_velocity(model, x_t, t, t5, clip, dtype, guidance_scale, control_tokens(control))

    return predict
