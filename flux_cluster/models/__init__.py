"""Model folders the tool writes itself (no hub is reachable from the clusters or CI)."""
