"""flux-cluster evaluate: inference latency (p50/p90/p99), CLIP score, validation loss and a sample grid
of a base FLUX pipeline and its fine-tuned weights, measured in one process (flux_cluster/evaluate/run.py).

Importing this package stays cheap (no torch): the CLI's --help imports it."""

SCHEMA = 1
KIND = "flux-cluster-eval"
DEFAULT_RUNS = 12
"""Timed generations per prompt (--runs), for each model: 96 with the 8 built-in prompts, enough for a p99."""
OPTIONS_FILE = "evaluate.json"
"""In an evaluate job's run directory: the options the job evaluates with ({"options": ...}, every path
absolute; flux_cluster/evaluate/options.py)."""


def grid_name(json_name: str) -> str:
    """The sample grid's file name beside an evaluation's JSON (the report reads it from there only)."""
    return json_name.removesuffix(".json") + "_grid.png"


def base_label(precision: str | None) -> str:
    """The base column's name: 'base', or 'base nf4' where it is the quantized base a LoRA run on
    train.base_precision nf4 trained beside (the document's base_precision)."""
    return "base" if precision is None else f"base {precision}"
