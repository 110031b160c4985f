"""MLPerf Training flux1 facts that the config, the training job and the report share. No heavy
imports: the CLI reads these at start-up.

Also the closed-division check of a run's settings (``closed_division_deviations``): a run that breaks
the rules is labelled non-conforming in its result log (``CONFORMANCE_KEY``), by its job's compliance
step (``python -m flux_cluster.jobs.compliance``) and in reports (``logged_deviations``; a run's
config: ``flux_cluster.config.workload.run_deviations``).

``python -m flux_cluster.mlperf_rules check ...``, the compliance step of job scripts rendered before it
moved (a job requeued after an upgrade runs its old script), still runs it: the new step, started by name.
"""

import json
import math
import os
import sys
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Literal, get_args

Ruleset = Literal["5.1.0", "6.0.0", "6.1.0"]
"""The MLPerf Training rulesets with a flux1 benchmark (mlperf_logging's compliance configs)."""
RULESETS: tuple[Ruleset, ...] = get_args(Ruleset)
QUALITY_TARGET = 0.586
"""flux1's validation-loss target."""
EVAL_INTERVAL_SAMPLES = 262_144
"""MLPerf evaluates flux1 every 262,144 samples, rounded up to whole steps."""
BENCHMARK_MODEL = "flux-schnell"
"""The model the closed division trains (from random init)."""
CHECK_TIMEOUT_S = 300.0
"""Longest one log's compliance check may take in a report (a real 10-hour log takes seconds)."""
CONFORMANCE_KEY = "flux_cluster_conformance"
"""Result-log event: value 'conforming' or 'non-conforming', metadata.reasons lists why."""


def eval_interval_steps(global_batch_size: int) -> int:
    """The closed division's steps between evaluations."""
    return math.ceil(EVAL_INTERVAL_SAMPLES / global_batch_size)


@dataclass(frozen=True)
class Deviation:
    """One way a run's settings break the closed-division rules."""

    reason: str
    log_key: str | None = None
    """The result-log key the official checker rejects because of it (None: the checker cannot see it)."""


def closed_division_deviations(
    train: Mapping[str, Any],
    mlperf: Mapping[str, Any],
    batch_presets: Collection[int],
    train_samples: int | None = None,
    eval_samples: int | None = None,
) -> list[Deviation]:
    """Why a run with these settings is no closed-division flux1 result ([] when it is one).

    ``train``: the resolved train section (every None filled, as in a run's config.yaml under
    job.training.train); ``mlperf`` and ``batch_presets``: the workload file's (configs/benchmarks/);
    ``train_samples``/``eval_samples``: the dataset's split sizes, when known."""
    found: list[Deviation] = []
    if train["mode"] != "pretrain":
        found.append(Deviation(f"mode {train['mode']} (the benchmark pretrains from random init)"))
    if train.get("optimizer", "adamw") != "adamw":
        found.append(Deviation(f"optimizer {train['optimizer']} (the benchmark uses AdamW)", "opt_name"))
    if train["model"] != BENCHMARK_MODEL:
        found.append(Deviation(f"model {train['model']} (the benchmark trains {BENCHMARK_MODEL})"))
    gbs = int(train["global_batch_size"])
    if gbs not in batch_presets:
        sizes = ", ".join(str(size) for size in sorted(batch_presets))
        found.append(Deviation(f"global batch {gbs} has no reference preset ({sizes})"))
    steps, closed_steps = int(train["eval_every_steps"]), eval_interval_steps(gbs)
    if steps != closed_steps:
        found.append(
            Deviation(
                f"evaluates every {steps * gbs:,} samples ({steps} steps), not every "
                f"{closed_steps * gbs:,} ({closed_steps} steps)",
                "evaluation_frequency",
            )
        )
    target = float(train["target"])
    if target != QUALITY_TARGET:
        # a looser target stops the run above 0.586, which the checker's eval_accuracy check rejects
        key = "eval_accuracy" if target > QUALITY_TARGET else None
        found.append(Deviation(f"target loss {target:g}, not {QUALITY_TARGET}", key))
    budget, closed_budget = int(train["max_samples"]), int(mlperf["max_samples"])
    if budget < closed_budget:
        found.append(
            Deviation(f"sample budget {budget:,} (train.max_samples), below the workload's {closed_budget:,}")
        )
    sizes = {"train": (train_samples, mlperf["train_samples"]), "val": (eval_samples, mlperf["eval_samples"])}
    for split, (have, want) in sizes.items():
        if have is not None and have != want:
            found.append(Deviation(f"{have:,} {split} samples, not flux1's {want:,}"))
    return found


def conformance_event(deviations: list[Deviation]) -> tuple[str, dict[str, list[str]]]:
    """(value, metadata) of the result log's CONFORMANCE_KEY event."""
    keys = sorted({d.log_key for d in deviations if d.log_key})
    return ("non-conforming" if deviations else "conforming"), {
        "reasons": [d.reason for d in deviations],
        "checker_keys": keys,
    }


def logged_conformance(result_log: Path) -> dict[str, list[str]] | None:
    """The CONFORMANCE_KEY event's metadata in a result log ({'reasons': [...], 'checker_keys': [...]},
    reasons [] when conforming); None when the log has none (another tool's, or an older one)."""
    needle = f'"key": "{CONFORMANCE_KEY}"'
    with result_log.open(errors="replace") as handle:
        for line in handle:
            if needle in line and line.startswith(":::MLLOG"):
                try:
                    metadata = json.loads(line[len(":::MLLOG") :])["metadata"]
                    return {k: [str(x) for x in metadata[k]] for k in ("reasons", "checker_keys")}
                except (ValueError, KeyError, TypeError):
                    return None
    return None


def logged_deviations(result_log: Path) -> list[str] | None:
    """The reasons a result log gives for being non-conforming ([] when it conforms, None: not said)."""
    conformance = logged_conformance(result_log)
    return None if conformance is None else conformance["reasons"]


TOKEN = b":::MLLOG "
"""What starts a result-log line the official parser reads (after any prefix on the line)."""
CHUNK_BYTES = 64 << 10
MAX_LINE_BYTES = 256 << 10
"""Longer lines (MLLOG lines are a few hundred bytes) are measured and skipped, never held whole."""


def bounded_lines(path: Path) -> Iterator[bytes | int]:
    """The non-empty lines as the official parser's text mode sees them (LF, CRLF and a lone CR each end
    one), read CHUNK_BYTES at a time. A line over MAX_LINE_BYTES (a crash's NUL fill, say) comes as its
    length only: memory stays bounded whatever the file holds."""
    head: list[bytes] = []  # the start of the line not yet ended, while it is short enough to keep
    held = 0  # its length (kept or not)

    def ended(tail: bytes) -> bytes | int:
        nonlocal head, held
        length, line = held + len(tail), b"".join([*head, tail])
        head, held = [], 0
        return line if length <= MAX_LINE_BYTES else length

    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            parts = chunk.splitlines()  # bytes split at LF, CRLF and CR only, as text mode does
            tail = b"" if chunk[-1] in b"\r\n" else parts.pop()
            if not parts:  # no line end in this chunk: the line goes on
                held += len(tail)
                head = [*head, tail] if held <= MAX_LINE_BYTES else []
                continue
            line = ended(parts[0])
            if line:
                yield line
            yield from filter(None, islice(parts, 1, None))  # whole lines, each < CHUNK_BYTES
            head, held = [tail], len(tail)
    line = ended(b"")
    if line:
        yield line


def read_loglines(path: Path, ruleset: str) -> tuple[list[Any], int, int]:
    """(the parser's LogLines of the log's :::MLLOG lines, lines it could not parse, MLLOG lines over
    MAX_LINE_BYTES dropped), streamed: memory holds the parsed lines, never the file."""
    import importlib

    parser = importlib.import_module(
        f"mlperf_logging.compliance_checker.mlp_parser.ruleset_{ruleset.replace('.', '')}"
    )
    loglines, failed, dropped, lineno = [], 0, 0, 0
    for line in bounded_lines(path):
        if isinstance(line, int):  # too long to hold (the harvester skips it too)
            dropped += 1
            continue
        at = line.rfind(TOKEN)
        if at < 0:
            continue
        # what the parser's re.sub(".*:::MLLOG ", ...) leaves, then its strip(), on latin-1 text
        text = line[at:].decode("latin-1").strip()
        try:
            loglines.append(parser.string_to_logline(lineno, text))
        except (ValueError, KeyError, TypeError, RecursionError):
            failed += 1
        lineno += 1
    return loglines, failed, dropped


COMPLIANCE_STEP = "flux_cluster.jobs.compliance"
"""The compliance step's module (flux_cluster/jobs/compliance.py), which job scripts run
(flux_cluster/launch/plan.py: COMPLIANCE_MODULE)."""


def _old_compliance_step(argv: list[str]) -> int:
    """`check ARGS` (the old step's only command, the same ARGS) becomes ``python -m COMPLIANCE_STEP ARGS``
    in this process's place: its output and exit code are the job's. Started by name, never imported:
    the shared floor does not reach up to the rank side's entry points."""
    if argv[:1] != ["check"]:
        print(
            f"error: python -m flux_cluster.mlperf_rules takes only 'check ARGS' (job scripts from before "
            f"the compliance step moved); run python -m {COMPLIANCE_STEP} ARGS",
            file=sys.stderr,
        )
        return 2
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", COMPLIANCE_STEP, *argv[1:]])
    return 2  # not reached: execv replaces this process or raises


if __name__ == "__main__":
    sys.exit(_old_compliance_step(sys.argv[1:]))
