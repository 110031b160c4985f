"""Model FLOPs per training sample of a FLUX transformer, counted from its shape.

Counted as multiply-accumulates (MACs) of the matmuls, times 2 for FLOPs, times 3 for training (the
backward pass costs twice the forward). Per sample, with L = image + text tokens and hidden size d:

- double-stream block: per token q,k,v and out projections (4 d^2) and the MLP (2 * r * d^2, r = 4),
  each stream its own weights; joint attention 2 L^2 d; adaLN modulation 2 streams x 6 d^2 per sample.
- single-stream block: per token the fused qkv+MLP-in (3 d + r d) d and the fused out ((1 + r) d) d,
  i.e. the same 12 d^2 as a double block; attention 2 L^2 d; modulation 3 d^2 per sample.
- embedders and head: x_embedder (in_channels x d per image token), context_embedder (T5 dim x d per text
  token), proj_out (d x in_channels per image token), the time/text embedding MLPs and norm_out.

Activation recomputation (checkpointing) is not counted: MFU reports useful model work. For the
flux-schnell shape (d 3072, 19 + 38 blocks, 256 + 256 tokens) this gives 20.4 TFLOP per sample, within
1% of the 20.3 NVIDIA uses for its throughput accounting.
"""

from flux_cluster.config.workload import ModelShape

FLUX_SCHNELL = ModelShape(hidden=3072, double_blocks=19, single_blocks=38)
NVIDIA_TFLOP_PER_SAMPLE = 20.3


def forward_macs(shape: ModelShape, image_tokens: int, text_tokens: int) -> dict[str, float]:
    """Forward multiply-accumulates per sample, by part."""
    d, r = shape.hidden, shape.mlp_ratio
    tokens = image_tokens + text_tokens
    per_token_block = (4 + 2 * r) * d * d  # qkv + out, and the MLP (in both stream kinds)
    attention = 2 * tokens * tokens * d  # q k^T and (attention) v
    return {
        "double_blocks": shape.double_blocks * (per_token_block * tokens + attention + 2 * 6 * d * d),
        "single_blocks": shape.single_blocks * (per_token_block * tokens + attention + 3 * d * d),
        "embedders": (
            shape.in_channels * d * image_tokens
            + shape.text_dim * d * text_tokens
            + (shape.timestep_dim * d + d * d)  # time MLP
            + (shape.pooled_dim * d + d * d)  # pooled-text MLP
        ),
        "head": 2 * d * d + d * shape.in_channels * image_tokens,  # norm_out modulation, proj_out
    }


def training_flops_per_sample(shape: ModelShape, image_tokens: int = 256, text_tokens: int = 256) -> float:
    """Forward + backward FLOPs of one training sample."""
    return 3 * 2 * sum(forward_macs(shape, image_tokens, text_tokens).values())
