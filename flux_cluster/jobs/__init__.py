"""The jobs flux-cluster can launch. Importing this module must stay cheap (no torch)."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class JobKind:
    name: str
    module: str
    """Python module run on every rank: ``python -m MODULE --config RUN_DIR/config.yaml``."""
    description: str
    writes_mlperf_log: bool
    run_minutes_from_system: bool
    """True: walltime comes from the system's mlperf.run_minutes; False: the job is short (minutes)."""
    writes_data: bool = False
    """Data preparation: the data root is mounted read-write and the download (source) root too."""
    minutes: int = 10
    """Walltime budget of one repeat when it does not come from the system (model load and compile
    included)."""


JOBS: dict[str, JobKind] = {
    "train": JobKind(
        name="train",
        module="flux_cluster.train",
        description="MLPerf flux1 training (FSDP2/HSDP), to the quality target",
        writes_mlperf_log=True,
        run_minutes_from_system=True,
    ),
    "throughput": JobKind(
        name="throughput",
        module="flux_cluster.jobs.throughput",
        description="The training step for warm-up then timed steps, no evaluation: samples/s, MFU, memory",
        writes_mlperf_log=False,
        run_minutes_from_system=False,
        minutes=20,
    ),
    "preflight": JobKind(
        name="preflight",
        module="flux_cluster.jobs.preflight",
        description="Per-node check: versions, accelerators, all_reduce bandwidth, data/log roots",
        writes_mlperf_log=False,
        run_minutes_from_system=False,
    ),
    "evaluate": JobKind(
        name="evaluate",
        module="flux_cluster.evaluate.job",
        description="flux-cluster evaluate: inference latency, CLIP score, samples (one rank, one GPU)",
        writes_mlperf_log=False,
        run_minutes_from_system=False,
    ),
}

DATA_STAGES = ("download", "convert", "index", "verify")
ENCODE_STAGES = ("encode", "encode-finish")
"""data encode --submit: an array encoding the image chunks, then one job writing the Energon root."""


def data_job(stage: str) -> JobKind:
    """The Slurm job of one prepare-data or data encode stage (see flux_cluster/launch/data_jobs.py)."""
    command = "data encode" if stage in ENCODE_STAGES else "prepare-data"
    return JobKind(
        name=f"data-{stage}",
        module="data_prep.job",
        description=f"{command}: the {stage} stage",
        writes_mlperf_log=False,
        run_minutes_from_system=False,
        writes_data=True,
    )


NOT_CONVERGED_EXIT_CODE = 3
"""Exit code of a pretraining run whose sample budget ran out before the quality target (run_stop
'aborted'). Fine-tuning runs train for their budget and end normally there."""


def read_job_file(path: Path, written_by: str) -> dict:
    """A JSON object a command wrote beside a job's config for the job (its options: never rendered into
    shell); anything else is one FluxClusterError line naming the file and what was expected."""
    import json

    from flux_cluster.errors import FluxClusterError

    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise FluxClusterError(f"{path}: cannot read it ({exc.strerror}): expected {written_by}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise FluxClusterError(f"{path}: not JSON ({exc}): expected {written_by}") from None
    if not isinstance(data, dict):
        raise FluxClusterError(f"{path}: got {type(data).__name__}, expected a JSON object: {written_by}")
    return data
