"""A sweep's points as they stand: each running point's status and figures read again from its run
directory (the throughput record, the result log, the job's state and log, Slurm), and the sweep's
report from that; writes nothing (a sweep's files are written by its runner alone, so a report never
races a running sweep)."""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from flux_cluster.config.hf import HF_BENCHMARK
from flux_cluster.errors import FluxClusterError
from flux_cluster.sweepdir import SWEEP_FILE, Point, SweepState, is_sweep_folder

if TYPE_CHECKING:
    from flux_cluster.config import SystemConfig
    from flux_cluster.report.sweep import SweepReport


def sweep_report(folder: Path) -> "SweepReport":
    """The report of the sweep in folder as it stands now."""
    from flux_cluster.report.sweep import build_report

    return build_report(folder, view(folder))


def sweep_reports(paths: Sequence[Path]) -> "list[SweepReport]":
    """One report per sweep folder; any other path among them is an error (result logs have a report
    of their own)."""
    others = [str(p) for p in paths if not is_sweep_folder(p)]
    if others:
        raise FluxClusterError(
            f"report sweep folders on their own: {', '.join(others)}: no {SWEEP_FILE} "
            "(report result logs and run directories in a separate command)"
        )
    return [sweep_report(path) for path in paths]


def view(folder: Path) -> SweepState:
    """The sweep as it stands now, written nowhere: sweep.json, each running point's state read again
    from its run directory (and Slurm)."""
    state = SweepState.load(folder)
    for point in state.points:
        if point.status == "running" and point.run_dir:
            classify(point)
    return state


def classify(point: Point) -> None:
    """A point's status and figures from its run directory: the throughput record, else the job's state."""
    from flux_cluster.launch.track import is_final, run_states
    from flux_cluster.rundir import RunRecord, throughput_file

    assert point.run_dir is not None
    run_dir = Path(point.run_dir)
    record_file = throughput_file(run_dir)
    if record_file.is_file():
        try:
            result = json.loads(record_file.read_text())
        except (OSError, ValueError) as exc:
            point.status, point.error = "failed", f"{record_file}: unreadable ({exc})"
            return
        point.result = result if isinstance(result, dict) else {}
        point.status = str(point.result.get("status", "failed"))
        point.error = point.result.get("error")
        return
    record = RunRecord.load(run_dir)
    states = run_states(run_dir, record) if record is not None else {}
    if not states or not all(is_final(s) for s in states.values()):
        point.status = "running"
        return
    if _train_figures(point, run_dir):
        return
    if all(s == "COMPLETED" for s in states.values()):
        point.status, point.error = "failed", "the job ended without writing its record"
    else:
        point.status, point.error = _failure(run_dir, states)


def _train_figures(point: Point, run_dir: Path) -> bool:
    """A train job's point: its figures from the result log (throughput, MFU) and the fine-tuning summary."""
    from flux_cluster.rundir import result_log

    log = result_log(run_dir, 0)
    if not log.is_file():
        return False
    from flux_cluster.report.harvest import harvest_run

    result = harvest_run(log)
    if result.status not in ("success", "aborted"):
        return False
    point.status = "ok" if result.status == "success" else "not converged"
    system = _run_system(run_dir)
    point.result = {
        "samples_per_s": result.throughput_samples_per_s,
        "samples_per_s_per_gpu": result.throughput_per_accelerator,
        "mfu": result.mfu,
        "world_size": result.accelerators,
        "nodes": system.nodes if system is not None else None,
        "wall_s": result.minutes * 60 if result.minutes else None,
    }
    if system is not None and system.train.benchmark == HF_BENCHMARK:
        from flux_cluster.report.hf import sweep_point_figures

        # its metrics summary's figures (steps alone, TFLOP/s, MFU, memory), on the GPUs it was given
        gpus = system.nodes * system.gpus_per_node
        point.result |= sweep_point_figures(log, result) | {"world_size": gpus}
        speed = point.result["samples_per_s"]
        point.result["samples_per_s_per_gpu"] = speed / gpus if speed is not None else None
    return True


def _run_system(run_dir: Path) -> "SystemConfig | None":
    """The system the run was launched with (its config.yaml), None if unreadable."""
    from flux_cluster.rundir import config_file, read_run_config

    try:
        system, _ = read_run_config(config_file(run_dir))
    except (OSError, ValueError, KeyError, TypeError, FluxClusterError):
        return None
    return system


FAILURE_TAIL_BYTES = 65536
"""How much of the end of a failed point's logs is searched for why it failed."""


def _failure(run_dir: Path, states: dict[str, str]) -> tuple[str, str]:
    """('oom' or 'failed', the reason): an out-of-memory in the log makes it oom even without a record
    (a train job, or a rank the OOM killed before it wrote)."""
    from flux_cluster.launch.track import log_files, log_tail
    from flux_cluster.rundir import RunRecord

    record = RunRecord.load(run_dir)
    text = ""
    if record is not None:
        for path in log_files(run_dir, record) + log_files(run_dir, record, stderr=True):
            text += log_tail(path, run_dir, FAILURE_TAIL_BYTES)
    if "OutOfMemoryError" in text or "out of memory" in text.lower():
        return "oom", "out of memory (see the run's log)"
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("error")]
    reason = lines[-1] if lines else ", ".join(sorted(set(states.values())))
    return "failed", reason[:300]


def reset(point: Point) -> None:
    point.status, point.error, point.result, point.job_ids = "pending", None, {}, []
    point.run_dir = point.launcher = None
