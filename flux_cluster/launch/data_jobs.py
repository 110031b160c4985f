"""prepare-data and data encode as Slurm jobs: each stage becomes a job of the ordinary job template, on a
system narrowed to one node and no MLPerf steps; convert and encode are arrays whose task i takes the i-th
share of the work. The stages are chained with afterok dependencies. Only the encode array asks for a GPU
(one per task, where the system requests GPUs as GRES)."""

from pathlib import Path

from flux_cluster.config.schema import SystemConfig
from flux_cluster.jobs import data_job
from flux_cluster.launch.plan import JobPlan

ARRAY_STAGES = ("convert", "encode")


def data_job_system(system: SystemConfig, stage: str, mounts: tuple[str, ...] = ()) -> SystemConfig:
    """mounts: extra 'SRC:DST[:ro]' bind mounts for a containerised stage (data encode's images, model and
    cache); ignored on bare metal."""
    prep = system.data_prep
    gpu = stage == "encode" and system.slurm.gres_gpus
    # docker/podman containers see every GPU of the node whatever Slurm allotted: a GPU task takes the node.
    whole_node = gpu and system.container.runtime in ("docker", "podman")
    slurm = system.slurm.model_copy(
        update={
            "partition": prep.partition or system.slurm.partition,
            "walltime": prep.download_walltime if stage == "download" else prep.walltime,
            "gres_gpus": gpu,
            "exclusive": whole_node,
            "cpus_per_task": prep.workers,
            "mem": prep.mem,
            "mem_per_cpu": None if prep.mem else system.slurm.mem_per_cpu,
            "requeue": False,  # a failed stage is re-run by hand; finished shards are skipped
        }
    )
    mlperf = system.mlperf.model_copy(
        update={
            "nexp": prep.tasks if stage in ARRAY_STAGES else 1,
            "nexp_mode": "array",
            "array_parallelism": None,
            "clear_caches": False,
            "comm_test": False,
            "verify_mounts": False,  # the output may not exist yet; the stage reports a missing input itself
            "check_compliance": False,
        }
    )
    update = {"nodes": 1, "gpus_per_node": 1, "slurm": slurm, "mlperf": mlperf}
    if mounts and system.container.runtime != "none":
        container = system.container.model_copy(update={"mounts": [*system.container.mounts, *mounts]})
        update["container"] = container
    return system.model_copy(update=update)


def data_job_plan(
    system: SystemConfig,
    stage: str,
    run_dir: Path,
    experiment: str,
    dependency: str | None,
    mounts: tuple[str, ...] = (),
) -> JobPlan:
    return JobPlan(
        system=data_job_system(system, stage, mounts),
        job=data_job(stage),
        run_dir=run_dir,
        experiment=experiment,
        seed_base=0,
        job_args=("--stage", stage),
        dependency=dependency,
    )
