"""The FLUX autoencoder's latent shift and scale: what the encoders check a pipeline for, synthetic data is
made with, and training applies to the stored latents (z - shift) * scale."""

LATENT_SHIFT = 0.1159
LATENT_SCALE = 0.3611
