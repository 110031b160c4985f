"""The flux1 rectified-flow objective and the MLPerf validation metric, independent of the model.

Training (reference): z = mean + exp(logvar / 2) * eps, then the autoencoder shift/scale; t ~ U(0, 1);
x_t = (1 - t) z + t noise; the model predicts noise - z; the loss is the mean squared error.
Validation: every val sample has a timestep index k in 0..7 and is evaluated at t = k / 8, with its
eps and noise drawn from a generator seeded by the sample's key, so two evaluations of the same
weights give the same number on any number of ranks. The metric is the mean over samples of the
per-sample mean squared error (over C, H, W), summed and counted across ranks.
"""

import hashlib
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from flux_cluster.models.latents import LATENT_SCALE, LATENT_SHIFT

VAL_TIMESTEPS = 8

Predict = Callable[..., torch.Tensor]
"""predict(x_t [B,C,H,W], t [B], t5 [B,S,D], clip [B,P]) -> velocity prediction [B,C,H,W]; batches of edit
pairs add control=[B,C,H,W] (the control image's latent mean)."""


def sample_latents(mean: torch.Tensor, logvar: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """The autoencoder's latent distribution sampled with eps, then shifted and scaled as FLUX does."""
    z = mean.float() + torch.exp(0.5 * logvar.float()) * eps
    return (z - LATENT_SHIFT) * LATENT_SCALE


def interpolate(z: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_t, target) of the rectified flow at times t [B]."""
    t = t.view(-1, *([1] * (z.dim() - 1)))
    return (1 - t) * z + t * noise, noise - z


def per_sample_mse(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (prediction.float() - target.float()).pow(2).flatten(1).mean(dim=1)


def key_generator(key: str, seed: int = 0) -> torch.Generator:
    """A CPU generator seeded from a sample key: the same draws on every rank and every evaluation."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def val_draws(keys: list[str], shape: tuple[int, ...], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(eps, noise) [B, *shape] for the val samples with these keys."""
    eps, noise = [], []
    for key in keys:
        generator = key_generator(key, seed)
        eps.append(torch.randn(shape, generator=generator))
        noise.append(torch.randn(shape, generator=generator))
    return torch.stack(eps), torch.stack(noise)


@torch.no_grad()
def validation_loss(
    predict: Predict,
    batches: Iterable[object],
    device: torch.device,
    seed: int = 0,
    spare: Callable[[], object] | None = None,
) -> tuple[float, int]:
    """(MLPerf validation loss, samples) over this rank's val batches, combined across all ranks.

    Each batch has keys, t5, clip, mean, logvar and timestep (as flux_cluster.data.loader.FluxBatch). The
    ranks step through their batches together: a sharded model's forward is a collective, and a rank's share
    of val can be a batch shorter than another's (or empty). A rank that has run out repeats its last
    batch, or ``spare()`` if it had none, uncounted, until every rank is done."""
    distributed = dist.is_available() and dist.is_initialized()
    if distributed and spare is None and dist.get_world_size() > 1:  # on every rank, before any collective
        raise ValueError("validation on several ranks needs spare(): a share of val can be empty")
    total = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of per-sample losses, samples)
    remaining = iter(batches)
    last: object | None = None
    while True:
        batch = next(remaining, None)
        if distributed:
            more = torch.tensor([batch is not None], dtype=torch.int32, device=device)
            dist.all_reduce(more, op=dist.ReduceOp.MAX)
            if not more.item():
                break
        elif batch is None:
            break
        counted = batch is not None
        if batch is None:
            if last is None:
                assert spare is not None
                last = spare()
            batch = last
        last = batch
        mean, logvar = batch.mean.to(device), batch.logvar.to(device)  # type: ignore[attr-defined]
        eps, noise = val_draws(list(batch.keys), tuple(mean.shape[1:]), seed)  # type: ignore[attr-defined]
        z = sample_latents(mean, logvar, eps.to(device))
        t = batch.timestep.to(device).float() / VAL_TIMESTEPS  # type: ignore[attr-defined]
        x_t, target = interpolate(z, noise.to(device), t)
        control = getattr(batch, "control", None)  # edit pairs: the control latents, FLUX Kontext's condition
        extra = {} if control is None else {"control": control.to(device)}
        prediction = predict(x_t, t, batch.t5.to(device), batch.clip.to(device), **extra)  # type: ignore[attr-defined]
        if counted:
            losses = per_sample_mse(prediction, target)
            total += torch.stack(
                [losses.double().sum(), torch.tensor(len(losses), dtype=torch.float64, device=device)]
            )
    if distributed:
        dist.all_reduce(total)
    samples = int(total[1].item())
    if samples == 0:
        raise ValueError("validation saw no samples")
    return float(total[0].item() / samples), samples
