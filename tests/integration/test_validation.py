"""The MLPerf validation metric: equal to a direct computation of the algorithm, repeatable, and the
same on 1 and 2 ranks."""

from pathlib import Path

import pytest
import torch
from data_helpers import make_energon_root, run_two_ranks

from flux_cluster.data.format import DIMS
from flux_cluster.data.loader import val_loader
from flux_cluster.models.latents import LATENT_SCALE, LATENT_SHIFT
from flux_cluster.training.rectified_flow import key_generator, validation_loss

HELPER = Path(__file__).parents[1] / "helpers" / "val_ranks.py"


class FixedModel(torch.nn.Module):
    """A deterministic stand-in for the transformer: the velocity from x_t, t and the pooled text."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.mix = torch.randn(16, 16, generator=generator) * 0.1
        self.text = torch.randn(32, 16, generator=generator) * 0.1

    def forward(
        self, x_t: torch.Tensor, t: torch.Tensor, t5: torch.Tensor, clip: torch.Tensor
    ) -> torch.Tensor:
        mixed = torch.einsum("bchw,cd->bdhw", x_t, self.mix)
        return mixed * (1 - t.view(-1, 1, 1, 1)) + (clip.float() @ self.text)[:, :, None, None]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_energon_root(tmp_path_factory.mktemp("val"), 16, 27)


def direct(root: Path, model: FixedModel) -> float:
    """The algorithm written out sample by sample, with no batching and no shared code path."""
    losses = []
    for batch in val_loader(root, batch_size=1, rank=0, world_size=1, dims=DIMS["tiny"]):
        key = batch.keys[0]
        generator = key_generator(key)
        eps = torch.randn((16, 16, 16), generator=generator)
        noise = torch.randn((16, 16, 16), generator=generator)
        latent = batch.mean[0].float() + torch.exp(batch.logvar[0].float() / 2) * eps
        z = (latent - LATENT_SHIFT) * LATENT_SCALE
        t = int(batch.timestep[0]) / 8
        x_t = (1 - t) * z + t * noise
        prediction = model(x_t[None], torch.tensor([t]), batch.t5, batch.clip)[0]
        losses.append(float(((prediction - (noise - z)) ** 2).mean()))
    return sum(losses) / len(losses)


def test_matches_a_direct_computation_and_repeats(root: Path) -> None:
    model = FixedModel()
    loss, samples = validation_loss(
        model, val_loader(root, batch_size=5, rank=0, world_size=1), torch.device("cpu")
    )
    assert samples == 27
    assert loss == pytest.approx(direct(root, model), rel=1e-6)
    again, _ = validation_loss(
        model, val_loader(root, batch_size=4, rank=0, world_size=1), torch.device("cpu")
    )
    assert again == pytest.approx(loss, rel=1e-9)


def test_two_ranks_give_the_single_rank_number(root: Path, tmp_path: Path) -> None:
    single, _ = validation_loss(
        FixedModel(), val_loader(root, batch_size=4, rank=0, world_size=1), torch.device("cpu")
    )
    ranks = run_two_ranks(HELPER, root, tmp_path)
    assert ranks[0] == ranks[1]
    assert ranks[0]["samples"] == 27
    assert ranks[0]["loss"] == pytest.approx(single, rel=1e-6)  # other batch shapes, other float rounding


@pytest.mark.parametrize("val", [3, 1], ids=["a batch more on rank 0", "nothing on rank 1"])
def test_ranks_with_uneven_val_shares_step_together(
    val: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's folder gives any val count: with batch 1 on 2 ranks, 3 samples are 2 + 1 batches and
    1 sample leaves a rank empty. Every rank runs as many forwards as the longest share (the model's
    forward is a collective there) and the loss counts each sample once."""
    root = make_energon_root(tmp_path / "data", 4, val)
    single, _ = validation_loss(
        FixedModel(), val_loader(root, batch_size=1, rank=0, world_size=1), torch.device("cpu")
    )
    monkeypatch.setenv("FLUX_TEST_VAL_BATCH", "1")
    ranks = run_two_ranks(HELPER, root, tmp_path)
    assert [r["forwards"] for r in ranks] == [(val + 1) // 2] * 2
    assert all(r["samples"] == val for r in ranks)
    assert ranks[0]["loss"] == ranks[1]["loss"] == pytest.approx(single, rel=1e-6)
