"""MLPerf Training flux1 facts that the config, the training job and the report share. No heavy
imports: the CLI reads these at start-up."""

from typing import Literal, get_args

Ruleset = Literal["5.1.0", "6.0.0", "6.1.0"]
"""The MLPerf Training rulesets with a flux1 benchmark (mlperf_logging's compliance configs)."""
RULESETS: tuple[Ruleset, ...] = get_args(Ruleset)
QUALITY_TARGET = 0.586
"""flux1's validation-loss target."""
