"""Pieces of the flux1 training job (the job itself, ``flux_cluster.train``, arrives with issue 4)."""
