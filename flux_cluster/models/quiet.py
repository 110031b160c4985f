"""Loading and saving diffusers/transformers models without their console chatter: per-file progress
bars, the libraries' known import-time notices, and (while a load may still fail) transformers' log
lines. Import this module before diffusers, transformers, peft or torchao (it imports only logging): the
notices are logged while those are imported. Import only where torch is wanted."""

import logging
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

# torchao's sources hold invalid escape sequences: compiling them (an install without .pyc files, as on
# the GPU image) warns once per file (SyntaxWarning from Python 3.12, DeprecationWarning before), telling
# a user nothing.
for _category in (SyntaxWarning, DeprecationWarning):
    warnings.filterwarnings("ignore", r"invalid escape sequence", _category, r".*torchao")
# peft reads transformers' deprecated is_gradient_checkpointing when it adds LoRA: the call is peft's.
warnings.filterwarnings("ignore", r"`is_gradient_checkpointing` is deprecated", FutureWarning)

KNOWN_NOTICES: dict[str, re.Pattern[str]] = {
    # Importing diffusers imports torchao when it is installed (fp8 training needs it); on machines
    # without its GPU kernels it cannot load them, and registers enums torch no longer needs registered.
    "torchao": re.compile(r"Failed to load \S*torchao\S*_C\w*\.\S*\.so: "),
    "torch.utils._pytree": re.compile(r"<enum '\w+'> is an Enum subclass and is now natively supported "),
    "diffusers.quantizers.torchao.torchao_quantizer": re.compile(
        r"Unable to import `torchao` Tensor objects"
    ),
    # bitsandbytes (imported by peft), on CPUs with AVX512-BF16: an optional 4-bit kernel is missing.
    "bitsandbytes.backends.cpu.ops": re.compile(
        r"Failed to load CPU gemm_4bit_forward from kernels-community"
    ),
    # transformers without torchvision, when diffusers imports the (unused) CLIP/SigLIP image processors.
    "transformers.utils.import_utils": re.compile(
        r"`\w+ImageProcessor` requires torchvision \(not installed\); falling back to `\w+ImageProcessorPil`"
    ),
    # A causal LM whose config names no loss (GPT-2's, any saved before loss_type existed) gets the default;
    # a loss_type it does not know is still said.
    "transformers.modeling_utils": re.compile(
        r"`loss_type=None` was set in the config but it is unrecognized"
    ),
}
"""Logger name -> the one notice dropped from it; which say nothing to a user and need nothing of them.
Any other record of these loggers, a warning or an error, still reaches the console."""


class _DropKnownNotice(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not self.pattern.match(record.getMessage())


for _name, _pattern in KNOWN_NOTICES.items():
    logging.getLogger(_name).addFilter(_DropKnownNotice(_pattern))

TRUNCATED = re.compile(r"The following part of your input was truncated because ")
"""diffusers' FLUX pipelines, per prompt and text encoder (T5 past max_sequence_length, CLIP past its 77
tokens): cutting the prompt there is what those lengths are for."""


@contextmanager
def notices_dropped(logger_name: str, pattern: re.Pattern[str]) -> Iterator[None]:
    """logger_name's notices that match pattern dropped for the block; its others, and any error, kept."""
    logger, dropped = logging.getLogger(logger_name), _DropKnownNotice(pattern)
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


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
