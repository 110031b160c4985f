"""System configuration: typed schema, YAML loading with composition, overrides and provenance."""

from flux_cluster.config.loader import ResolvedSystem, known_systems, load_system, load_yaml_safely
from flux_cluster.config.schema import SystemConfig

__all__ = ["ResolvedSystem", "SystemConfig", "known_systems", "load_system", "load_yaml_safely"]
