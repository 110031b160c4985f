"""prepare-data and data encode as Slurm jobs: each stage becomes a job of the ordinary job template, on a
system narrowed to one node and no MLPerf steps; convert and encode are arrays whose task i takes the i-th
share of the work. The stages are chained with afterok dependencies. Only the encode array asks for a GPU
(one per task, where the system requests GPUs as GRES)."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flux_cluster.config.schema import SystemConfig
from flux_cluster.launch.plan import JobPlan, data_job

if TYPE_CHECKING:
    from rich.console import Console

    from flux_cluster.data.prep.encode import EncodeOptions
    from flux_cluster.launch.submit import Launched

ARRAY_STAGES = ("convert", "encode")


def data_job_system(system: SystemConfig, stage: str, mounts: tuple[str, ...] = ()) -> SystemConfig:
    """mounts: extra 'SRC:DST[:ro]' bind mounts for a containerised stage (data encode's images, model and
    cache); ignored on bare metal."""
    prep = system.data_prep
    gpu = stage == "encode" and system.slurm.gres_gpus  # a container sees only its task's GPU (sbatch.sh.j2)
    slurm = system.slurm.model_copy(
        update={
            "partition": prep.partition or system.slurm.partition,
            "walltime": prep.download_walltime if stage == "download" else prep.walltime,
            "gres_gpus": gpu,
            "exclusive": False,
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


@dataclass(frozen=True)
class StageJob:
    """One stage as submit_stages started it."""

    stage: str
    launched: "Launched"


def submit_stages(
    config: SystemConfig,
    stages: list[str],
    runs_dir: Path | None,
    dry_run: bool,
    command: str = "prepare-data",
    mounts: tuple[str, ...] = (),
    prepare: Callable[[Path], None] | None = None,
    folders: tuple[Path, ...] = (),
) -> list[StageJob]:
    """Each stage a job in its own run directory under <runs>/<command>, chained by afterok (a dry run has
    no job ids to chain: its scripts are submitted in order by hand); prepare writes what a stage's job
    reads beside its config, before it is submitted. The jobs' mount sources (the data root, the source
    root for a download, folders) are made first; if the first stage is refused, every folder this made
    goes again (its run folder's parents <runs>/<command>/ and <runs>/ included), those still empty."""
    from flux_cluster.launch.folders import make_folders, remove_made
    from flux_cluster.launch.submit import check_slurm_path, launch_plan, require_slurm
    from flux_cluster.rundir import create_run_dir, runs_root

    require_slurm(config)
    root = runs_root(runs_dir, config).absolute()
    check_slurm_path(root)
    needed = list(folders)
    for key in ("source_root", "data_root"):
        value = getattr(config.paths, key)
        if value is not None:
            check_slurm_path(Path(value))
            # Pyxis and docker need a mount's source to exist; the source root is made only for a download.
            if key == "data_root" or "download" in stages:
                needed.append(Path(value))
    experiment = command.replace(" ", "-")
    made = make_folders([root / experiment, *([] if dry_run else needed)])
    dependency: str | None = None
    started: list[StageJob] = []
    for stage in stages:
        try:
            run_dir = create_run_dir(root, experiment, f"{config.name}-{stage}")
            plan = data_job_plan(config, stage, run_dir, experiment, dependency, mounts)
            launched = launch_plan(plan, dry_run=dry_run, prepare=prepare)
        except BaseException:
            if not started:  # no job will use them
                remove_made(made)
            raise
        started.append(StageJob(stage, launched))
        if not dry_run:
            dependency = f"afterok:{launched.record.job_ids[0].split('_')[0]}"
    return started


def submit_encode(
    options: "EncodeOptions",
    system: str,
    sets: list[str | tuple[str, str]],
    runs_dir: Path | None,
    dry_run: bool,
    console: "Console",
) -> list[StageJob]:
    """data encode as an encode array and an encode-finish job; everything is checked before either is
    submitted, and the options reach the jobs as a file in their run directories, never in the script."""
    import dataclasses

    from flux_cluster.config import load_system
    from flux_cluster.data.prep.encode import Encoding
    from flux_cluster.data.prep.job_options import write_encode_options
    from flux_cluster.data.prep.stages import ENCODE_STAGES
    from flux_cluster.launch.submit import check_slurm_path, require_slurm
    from flux_cluster.rundir import runs_root

    # Absolute, and the cache fixed here: the compute nodes (or a container) have another $HOME.
    options = dataclasses.replace(
        options,
        images=options.images.absolute(),
        output=options.output.absolute(),
        model=options.model.absolute(),
        cache=options.cache_root.absolute(),
    )
    cache = options.cache
    assert cache is not None
    sets = [*sets, (f"paths.data_root={options.output}", "OUT"), ("paths.source_root=null", "data encode")]
    config = load_system(system, sets).config
    require_slurm(config)
    # They become mount specifications (no ':' or ','); the run dirs and OUT are checked again later.
    for path in (options.images, options.model, cache, options.output, runs_root(runs_dir, config)):
        check_slurm_path(path.absolute())
    # Scans the folder, needs a train and a val image, and refuses an OUT holding another dataset.
    encoding = Encoding(options, console)
    encoding.check_output()
    console.print(
        f"{len(encoding.items):,} images, {len(encoding.scan.problems)} skipped; encodings cached in "
        f"{encoding.folder} (it must be on a file system the compute nodes share)",
        soft_wrap=True,
        highlight=False,
    )
    mounts = (f"{options.images}:{options.images}:ro", f"{options.model}:{options.model}:ro")
    mounts += (f"{cache}:{cache}",)

    def prepare(run_dir: Path) -> None:
        write_encode_options(run_dir, options)

    return submit_stages(
        config,
        list(ENCODE_STAGES),
        runs_dir,
        dry_run,
        command="data encode",
        mounts=mounts,
        prepare=prepare,
        folders=(cache,),  # a container mount's source must exist
    )
