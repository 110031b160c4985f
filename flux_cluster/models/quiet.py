"""Loading and saving diffusers/transformers models without their console chatter: per-file progress
bars, and (while a load may still fail) transformers' log lines. Import only where torch is wanted."""

import logging
from collections.abc import Iterator
from contextlib import contextmanager

# Importing diffusers imports torchao when it is installed (fp8 training needs it); on machines without
# its GPU kernels torchao and torch log a warning per kernel library and enum, which say nothing to a user;
# bitsandbytes (imported by peft) warns on CPUs with AVX512-BF16 that an optional 4-bit kernel is missing.
for _name in (
    "torchao",
    "torch.utils._pytree",
    "diffusers.quantizers.torchao.torchao_quantizer",
    "bitsandbytes.backends.cpu.ops",
):
    logging.getLogger(_name).setLevel(logging.ERROR)


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """diffusers' and transformers' progress bars off ("Loading weights", "Writing model shards"): the
    callers report progress their own way."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    enabled = [(lib, lib.is_progress_bar_enabled()) for lib in (diffusers_logging, transformers_logging)]
    for lib, _ in enabled:
        lib.disable_progress_bar()
    try:
        yield
    finally:
        for lib, was_enabled in enabled:
            if was_enabled:
                lib.enable_progress_bar()


class _Hold(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def held_transformers_logs() -> Iterator[list[logging.LogRecord]]:
    """transformers' log records held back: dropped if the block raises (a failed load logs a table of
    the keys that do not fit, then raises "see the above report"; the caller makes that one line),
    printed after it if it does not."""
    from transformers.utils import logging as transformers_logging

    # get_logger first sets up transformers' own handler, which would otherwise land among the held ones
    library = transformers_logging.get_logger("transformers")
    hold, saved = _Hold(), (library.handlers, library.propagate)
    library.handlers, library.propagate = [hold], False
    try:
        yield hold.records
    finally:
        library.handlers, library.propagate = saved
    for record in hold.records:  # reached only when the block did not raise
        library.handle(record)


@contextmanager
def library_warnings_off() -> Iterator[None]:
    """diffusers' and transformers' warnings off for the block, their verbosity restored after it (e.g. a
    caption cut to max_sequence_length, which is that setting's purpose, once per batch)."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    before = [(lib, lib.get_verbosity()) for lib in (diffusers_logging, transformers_logging)]
    for lib, _ in before:
        lib.set_verbosity_error()
    try:
        yield
    finally:
        for lib, level in before:
            lib.set_verbosity(level)
