"""The settings every config model shares (a system's sections, the workload files): attribute docstrings,
unknown keys refused, frozen, and every float finite.

NaN and infinity mean nothing in any setting here (a learning rate, a target, a price, a fraction): a
YAML ``.inf`` or ``1e400`` (which parses as infinity) is refused like ``.nan``, by this one rule
(pydantic's allow_inf_nan) rather than a bound per key.
"""

from pydantic import ConfigDict

SECTION = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True, allow_inf_nan=False)
"""Every config model's model_config (or the start of it)."""
