"""flux-cluster evaluate: inference latency (p50/p90/p99), CLIP score, validation loss and a sample grid
of a base FLUX pipeline and its fine-tuned weights, measured in one process (flux_cluster/evaluate/run.py).

Importing this package stays cheap (no torch): the CLI's --help imports it."""

SCHEMA = 1
KIND = "flux-cluster-eval"
ARGS_FILE = "evaluate.json"
"""In an evaluate job's run directory: the command line the job runs, every path absolute."""


def first_line(exc: BaseException) -> str:
    """A library error as one line: its message's first line, else its type."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
