"""How many operators the host dispatches in a training step: a CPU-measurable guard against host-bound
steps. Every aten operator the host dispatches costs it microseconds (and, on a GPU, usually a kernel
launch); compiled graphs run as one call each, so what is counted is what runs outside them (FSDP's
hooks, casts, the optimizer) plus the library calls compiled code makes (matmuls, attention)."""

from collections import Counter
from collections.abc import Callable
from typing import Any

from torch._ops import HigherOrderOperator
from torch.utils._python_dispatch import TorchDispatchMode


class DispatchCounter(TorchDispatchMode):
    """Counts the operators dispatched while active, by name (``counts``) and in all (``total``).

    torch.compile keeps compiling under it (``ignore_compile_internals``): a compiled graph's fused
    kernels are not operators, so the count is what the host really dispatches, not what eager would."""

    supports_higher_order_operators = True  # checkpointing's and compiled autograd's wrappers pass through

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # A higher-order operator (a compiled region's wrapper) counts once; the mode is off inside it.
        self.counts[func.name() if isinstance(func, HigherOrderOperator) else str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def count_dispatched(step: Callable[..., object], *args: Any, **kwargs: Any) -> DispatchCounter:
    """Run ``step(*args, **kwargs)`` once under a DispatchCounter and return the counter."""
    with DispatchCounter() as counter:
        step(*args, **kwargs)
    return counter
