"""Pieces of benchmarks/train_throughput.py (run it, not these)."""
