"""MLPerf result logs for flux1, written through mlperf_logging.mllog on rank 0 only.

The keys and values are those the closed flux1 rulesets 5.1.0, 6.0.0 and 6.1.0 check: the submission
header, the hyperparameters (evaluation_frequency: the samples really trained between evals), 6.1.0's
precision, parallelism and config disclosure, and the init/run/block/eval timeline with samples_count.
Every log also says whether the run's settings conform to the closed division, and if not why
(flux_cluster.mlperf_rules.CONFORMANCE_KEY).
"""

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mlperf_logging.mllog import constants as c
from mlperf_logging.mllog.mllog import MLLogger

from flux_cluster.config.batch_fit import BatchFit
from flux_cluster.mlperf_rules import (
    CONFORMANCE_KEY,
    EVAL_INTERVAL_SAMPLES,
    Deviation,
    Ruleset,
    conformance_event,
    eval_interval_steps,
)

ADAMW = {"beta_1": 0.9, "beta_2": 0.95, "epsilon": 1e-08, "weight_decay": 0.1}
"""The only AdamW settings closed flux1 allows."""
GRADIENT_CLIP_NORM = 1.0
Precision = Literal["fp32", "tf32", "fp16", "bfloat16", "fp8"]


def evaluation_frequency(
    ruleset: Ruleset, global_batch_size: int, eval_every_steps: int | None = None
) -> int:
    """The samples between evals (whole steps; None: the closed division's ceil(262144 / GBS) steps).
    5.1.0 defines the value of a closed-division interval as the nominal 262,144; any other interval is
    logged as it is, so the checker sees what happened."""
    closed = eval_interval_steps(global_batch_size)
    steps = closed if eval_every_steps is None else eval_every_steps
    if ruleset == "5.1.0" and steps == closed:
        return EVAL_INTERVAL_SAMPLES
    return steps * global_batch_size


@dataclass(frozen=True)
class RunFacts:
    """What the header of a flux1 result log discloses."""

    submission_org: str
    submission_platform: str
    global_batch_size: int
    micro_batch_size: int
    learning_rate: float
    warmup_steps: int
    train_samples: int
    eval_samples: int
    config_filename: str
    division: Literal["closed", "open"] = "closed"
    gradient_accumulation_steps: int = 1
    precision_linear: Precision = "bfloat16"
    precision_attn: Precision = "bfloat16"
    precision_comm: Precision = "bfloat16"
    """FSDP all-gathers bf16 parameters; gradients are reduced in fp32."""
    seed: int | None = None
    eval_every_steps: int | None = None
    """Steps between evals; None: the closed division's."""
    deviations: tuple[Deviation, ...] = ()
    """How the settings break the closed-division rules (flux_cluster.mlperf_rules)."""
    benchmark: str = "flux1"
    """The workload: flux1, or a fine-tuning workload's name (no MLPerf benchmark)."""
    optimizer: str = "adamw"
    """train.optimizer: the closed division allows only 'adamw' with the ADAMW settings."""
    batch_fit: BatchFit | None = None
    """Fine-tuning: the batch fitted to a small train split (config/batch_fit.py), at submit or at the
    job's start; the header's global_batch_size and micro_batch_size are the batch taken."""

    def __post_init__(self) -> None:
        if self.global_batch_size < 1 or self.micro_batch_size < 1 or self.gradient_accumulation_steps < 1:
            raise ValueError("batch sizes and gradient accumulation steps must be positive")
        if self.global_batch_size % (self.micro_batch_size * self.gradient_accumulation_steps):
            raise ValueError("global_batch_size must be a multiple of micro_batch_size x accumulation steps")


def header_events(facts: RunFacts, ruleset: Ruleset) -> Iterator[tuple[str, Any]]:
    """(key, value) of every point-in-time event logged between init_start and init_stop."""
    yield c.SUBMISSION_ORG, facts.submission_org
    yield c.SUBMISSION_PLATFORM, facts.submission_platform
    yield c.SUBMISSION_DIVISION, facts.division
    yield c.SUBMISSION_STATUS, "onprem"
    yield c.SUBMISSION_BENCHMARK, facts.benchmark
    if facts.seed is not None:
        yield c.SEED, facts.seed
    yield c.GLOBAL_BATCH_SIZE, facts.global_batch_size
    yield c.GRADIENT_ACCUMULATION_STEPS, facts.gradient_accumulation_steps
    frequency = evaluation_frequency(ruleset, facts.global_batch_size, facts.eval_every_steps)
    yield "evaluation_frequency", frequency  # no constant for it
    yield c.OPT_NAME, facts.optimizer
    if facts.optimizer != "prodigy":  # AdamW's settings (8-bit AdamW keeps them); Prodigy has its own
        yield c.OPT_ADAMW_BETA_1, ADAMW["beta_1"]
        yield c.OPT_ADAMW_BETA_2, ADAMW["beta_2"]
        yield c.OPT_ADAMW_EPSILON, ADAMW["epsilon"]
        yield c.OPT_ADAMW_WEIGHT_DECAY, ADAMW["weight_decay"]
    yield c.OPT_BASE_LR, facts.learning_rate
    yield "opt_learning_rate_warmup_steps", facts.warmup_steps
    yield "opt_gradient_clip_norm", GRADIENT_CLIP_NORM
    yield c.TRAIN_SAMPLES, facts.train_samples
    yield c.EVAL_SAMPLES, facts.eval_samples
    if ruleset not in ("5.1.0", "6.0.0"):  # 6.1.0 added mandatory precision/parallelism/config disclosure
        yield "lowest_numerical_precision_in_linear", facts.precision_linear
        yield "lowest_numerical_precision_in_attn", facts.precision_attn
        yield "lowest_numerical_precision_in_comm", facts.precision_comm
        yield "tensor_parallelism", 1
        yield "pipeline_parallelism", 1
        yield "context_parallelism", 1
        yield "expert_parallelism", 1
        yield "micro_batch_size", facts.micro_batch_size
        yield "config_filename", facts.config_filename


class MlperfLog:
    """The result log of one run. On ranks other than 0 every call does nothing."""

    def __init__(self, path: Path | None, *, enabled: bool, echo: bool = False) -> None:
        self.enabled = enabled
        self._handlers: list[logging.Handler] = []
        if not enabled:
            return
        # A private logger per run: mllog.config() would add handlers to a process-wide one.
        logger = logging.getLogger(f"flux_cluster.mlperf.{id(self)}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handlers.append(logging.FileHandler(path, mode="a"))
        if echo:
            self._handlers.append(logging.StreamHandler())
        for handler in self._handlers:
            logger.addHandler(handler)
        self._mllog = MLLogger(logger=logger, default_stack_offset=2)

    def event(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None, **kw: Any) -> None:
        if self.enabled:
            self._mllog.event(key=key, value=value, metadata=metadata, **kw)

    def start(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None, **kw: Any) -> None:
        if self.enabled:
            self._mllog.start(key=key, value=value, metadata=metadata, **kw)

    def end(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None, **kw: Any) -> None:
        if self.enabled:
            self._mllog.end(key=key, value=value, metadata=metadata, **kw)

    def header(self, facts: RunFacts, ruleset: Ruleset, cache_cleared: bool) -> None:
        """cache_clear and init_start, then the header; the caller logs init_stop when set up."""
        self.event(c.CACHE_CLEAR, value=cache_cleared)
        self.start(c.INIT_START)
        for key, value in header_events(facts, ruleset):
            self.event(key, value=value)
        value, metadata = conformance_event(list(facts.deviations))
        self.event(CONFORMANCE_KEY, value=value, metadata=metadata)
        if facts.deviations and self.enabled:  # said once, in the job output too
            reasons = "; ".join(d.reason for d in facts.deviations)
            print(f"[train] NON-CONFORMING: not an MLPerf closed-division result: {reasons}", flush=True)
        if (fit := facts.batch_fit) is not None:  # not an MLPerf key; its line in the job output too
            self.event("batch_fit", value=fit.global_batch, metadata=fit.model_dump())
            if self.enabled:
                print(f"[train] {fit.describe()}", flush=True)

    def eval_accuracy(self, loss: float, samples: int, epoch: float | None = None) -> None:
        metadata: dict[str, Any] = {"samples_count": samples}
        if epoch is not None:
            metadata["epoch_num"] = round(epoch, 4)
        self.event(c.EVAL_ACCURACY, value=loss, metadata=metadata)

    def run_stop(self, success: bool, samples: int) -> None:
        status = c.SUCCESS if success else c.ABORTED
        self.end(c.RUN_STOP, metadata={"status": status, "samples_count": samples})

    def close(self) -> None:
        for handler in self._handlers:
            handler.close()
