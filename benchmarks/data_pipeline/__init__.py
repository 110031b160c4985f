"""Pieces of benchmarks/data_prep.py (run it, not these)."""
