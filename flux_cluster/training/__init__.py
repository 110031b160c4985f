"""Pieces of the flux1 training job; the entry point is ``flux_cluster.jobs.train``."""
