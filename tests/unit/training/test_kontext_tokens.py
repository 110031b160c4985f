"""FLUX Kontext training on one process: the control image's tokens and position ids are what
diffusers' FluxKontextPipeline feeds the transformer, and the prediction (the loss's input) covers the
target's tokens only."""

import torch
from diffusers import FluxKontextPipeline, FluxTransformer2DModel

from flux_cluster.config.workload import load_workload
from flux_cluster.models.latents import LATENT_SCALE, LATENT_SHIFT
from flux_cluster.training import kontext as K
from flux_cluster.training import model as M

TINY = load_workload("flux1")[0].models["tiny"]


def test_control_tokens_and_ids_are_diffusers_kontexts() -> None:
    control = torch.randn(2, 16, 4, 6, generator=torch.Generator().manual_seed(0))
    tokens, ids = K.control_tokens(control)  # type: ignore[misc]
    assert K.control_tokens(None) is None  # a text-to-image batch
    # The control's tokens: its latents as FluxKontextPipeline encodes an image (the mode, shifted, scaled)
    # and packs them, with the ids of its prepare_latents (first id 1, then row and column).
    expected = FluxKontextPipeline._pack_latents((control - LATENT_SHIFT) * LATENT_SCALE, 2, 16, 4, 6)
    torch.testing.assert_close(tokens, expected)
    diffusers_ids = FluxKontextPipeline._prepare_latent_image_ids(2, 2, 3, "cpu", torch.float32)
    diffusers_ids[..., 0] = 1
    assert ids.shape == (6, 3) and torch.equal(ids, diffusers_ids)
    target_ids, _ = M.position_ids(4, 6, 5, torch.device("cpu"))
    assert torch.equal(ids[:, 1:], target_ids[:, 1:]) and target_ids[:, 0].tolist() == [0.0] * 6


def test_prediction_is_the_target_tokens_of_the_joint_forward_and_depends_on_the_control() -> None:
    torch.manual_seed(0)
    model = FluxTransformer2DModel(**TINY.model_dump())
    generator = torch.Generator().manual_seed(1)
    x_t = torch.randn(2, 16, 4, 4, generator=generator)
    t = torch.rand(2, generator=generator)
    t5 = torch.randn(2, 3, TINY.joint_attention_dim, generator=generator)
    clip = torch.randn(2, TINY.pooled_projection_dim, generator=generator)
    control = torch.randn(2, 16, 4, 4, generator=generator)
    with torch.no_grad():
        edit = M.predict_velocity(model, x_t, t, t5, clip, torch.float32, extra=K.control_tokens(control))
        other = M.predict_velocity(
            model, x_t, t, t5, clip, torch.float32, extra=K.control_tokens(control.flip(0))
        )
        plain = M.predict_velocity(model, x_t, t, t5, clip, torch.float32)
        # The same forward by hand, as FluxKontextPipeline's denoising step calls the transformer: target
        # tokens then control tokens, their ids likewise.
        img_ids, txt_ids = M.position_ids(4, 4, 3, torch.device("cpu"))
        tokens, ids = K.control_tokens(control)  # type: ignore[misc]
        out = model(
            hidden_states=torch.cat([M.pack_latents(x_t), tokens], dim=1),
            encoder_hidden_states=t5,
            pooled_projections=clip,
            timestep=t,
            img_ids=torch.cat([img_ids, ids]),
            txt_ids=txt_ids,
            return_dict=False,
        )[0]
    assert edit.shape == x_t.shape
    torch.testing.assert_close(edit, M.unpack_latents(out[:, :4], 16, 4, 4))
    assert not torch.allclose(edit, other) and not torch.allclose(edit, plain)
    # the one prediction training's evaluation and `evaluate` both give validation_loss
    predict = K.velocity_predictor(model, torch.float32, 3.5)
    with torch.no_grad():
        assert torch.equal(predict(x_t, t, t5, clip, control), edit)
        assert torch.equal(predict(x_t, t, t5, clip), plain)


def test_validation_gives_an_edit_pairs_control_to_the_prediction_and_a_plain_batch_none() -> None:
    from types import SimpleNamespace

    from flux_cluster.training.rectified_flow import validation_loss

    seen: list[torch.Tensor | None] = []

    def predict(x_t, t, t5, clip, control=None):  # type: ignore[no-untyped-def]
        seen.append(control)
        return torch.zeros_like(x_t)

    def batch(control: torch.Tensor | None) -> SimpleNamespace:
        mean = torch.randn(2, 16, 4, 4)
        plain = {"keys": ["a", "b"], "t5": torch.randn(2, 8, 32), "clip": torch.randn(2, 32), "mean": mean}
        plain |= {"logvar": torch.zeros_like(mean), "timestep": torch.tensor([1, 5]), "control": control}
        return SimpleNamespace(**plain)

    control = torch.randn(2, 16, 4, 4)
    validation_loss(predict, [batch(control), batch(None)], torch.device("cpu"))
    assert len(seen) == 2 and seen[0] is not None and torch.equal(seen[0], control) and seen[1] is None
