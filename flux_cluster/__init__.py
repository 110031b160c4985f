"""flux-cluster: the MLPerf Training flux1 benchmark and FLUX fine-tuning on GPU clusters."""

__version__ = "0.1.0"
