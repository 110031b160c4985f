"""The jobs flux-cluster can launch. Importing this module must stay cheap (no torch)."""

from dataclasses import dataclass


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


JOBS: dict[str, JobKind] = {
    "train": JobKind(
        name="train",
        module="flux_cluster.train",
        description="MLPerf flux1 training (FSDP2/HSDP), to the quality target",
        writes_mlperf_log=True,
        run_minutes_from_system=True,
    ),
    "preflight": JobKind(
        name="preflight",
        module="flux_cluster.jobs.preflight",
        description="Per-node check: versions, accelerators, all_reduce bandwidth, data/log roots",
        writes_mlperf_log=False,
        run_minutes_from_system=False,
    ),
}

DATA_STAGES = ("download", "convert", "index", "verify")


def data_job(stage: str) -> JobKind:
    """The Slurm job of one prepare-data stage (see flux_cluster/data_jobs.py)."""
    return JobKind(
        name=f"data-{stage}",
        module="data_prep.job",
        description=f"prepare-data: the {stage} stage",
        writes_mlperf_log=False,
        run_minutes_from_system=False,
        writes_data=True,
    )


PREFLIGHT_MINUTES = 10
"""Walltime budget of one preflight repeat, soak time added on top."""

NOT_CONVERGED_EXIT_CODE = 3
"""Exit code of a pretraining run whose sample budget ran out before the quality target (run_stop
'aborted'). Fine-tuning runs train for their budget and end normally there."""
