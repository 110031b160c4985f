"""prepare-data as Slurm jobs: each stage becomes a job of the ordinary job template, on a system
narrowed to one node, no GPUs and no MLPerf steps; convert is an array whose task i takes the i-th
range of shards. The stages are chained with afterok dependencies."""

from pathlib import Path

from flux_cluster.config.schema import SystemConfig
from flux_cluster.jobs import data_job
from flux_cluster.plan import JobPlan


def data_job_system(system: SystemConfig, stage: str) -> SystemConfig:
    prep = system.data_prep
    slurm = system.slurm.model_copy(
        update={
            "partition": prep.partition or system.slurm.partition,
            "walltime": prep.download_walltime if stage == "download" else prep.walltime,
            "gres_gpus": False,
            "exclusive": False,
            "cpus_per_task": prep.workers,
            "mem": prep.mem,
            "mem_per_cpu": None if prep.mem else system.slurm.mem_per_cpu,
            "requeue": False,  # a failed stage is re-run by hand; finished shards are skipped
        }
    )
    mlperf = system.mlperf.model_copy(
        update={
            "nexp": prep.tasks if stage == "convert" else 1,
            "nexp_mode": "array",
            "array_parallelism": None,
            "clear_caches": False,
            "comm_test": False,
            "verify_mounts": False,  # the output may not exist yet; the stage reports a missing input itself
            "check_compliance": False,
        }
    )
    return system.model_copy(update={"nodes": 1, "gpus_per_node": 1, "slurm": slurm, "mlperf": mlperf})


def data_job_plan(
    system: SystemConfig, stage: str, run_dir: Path, experiment: str, dependency: str | None
) -> JobPlan:
    return JobPlan(
        system=data_job_system(system, stage),
        job=data_job(stage),
        run_dir=run_dir,
        experiment=experiment,
        seed_base=0,
        job_args=("--stage", stage),
        dependency=dependency,
    )
