"""The one exception type that reaches users as a single clean line (no traceback)."""


class FluxClusterError(Exception):
    """A user-facing error: the message names the file, the key and what was expected."""
