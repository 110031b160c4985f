"""flux-cluster evaluate --submit: the evaluation as one Slurm job (one GPU) running
``python -m flux_cluster.jobs.evaluate`` with the options written in its run directory. Everything is
checked here first; every path the job reads is absolute and mounted (read-only but where it writes), and
the options never go into the script."""

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flux_cluster.config.schema import SlurmConfig, SystemConfig
    from flux_cluster.evaluate.options import EvalOptions
    from flux_cluster.launch.submit import Launched

JOB_MINUTES = 60
"""Walltime added to the short-job budget: 2 x 96 generations (--runs 12 of the 8 built-in prompts) of
FLUX.1-dev at 28 steps take minutes; a long prompt file at many --runs may need more."""

_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def one_gpu_slurm(system: "SystemConfig") -> "SlurmConfig":
    """The system's Slurm settings for a job on one of a node's GPUs: not --exclusive, and that GPU's
    share of the node's memory and cores (slurm.one_gpu_mem / one_gpu_cpus, else derived from mem and
    cpus_per_task), so the node's other GPUs stay free for other jobs."""
    slurm = system.slurm
    mem = slurm.one_gpu_mem
    if mem is None and slurm.mem not in (None, "0"):
        assert slurm.mem is not None
        digits, unit = (slurm.mem[:-1], slurm.mem[-1]) if slurm.mem[-1] in _MIB else (slurm.mem, "M")
        mem = f"{max(1, int(int(digits) * _MIB[unit]) // system.gpus_per_node)}M"
    return slurm.model_copy(
        update={
            "exclusive": False,
            "mem": mem,
            "mem_per_cpu": None if mem is not None else slurm.mem_per_cpu,
            "cpus_per_task": slurm.one_gpu_cpus or slurm.cpus_per_task,
        }
    )


def evaluate_slurm_system(system: "SystemConfig", mounts: tuple[str, ...]) -> "SystemConfig":
    """The system as the one-GPU evaluate job runs on it: one node, one rank, one GPU's share of the node
    (one_gpu_slurm), no MLPerf steps; mounts: 'SRC:DST[:ro]' for the models and outputs in a container
    (ignored on bare metal)."""
    slurm = one_gpu_slurm(system).model_copy(update={"requeue": False})
    mlperf = system.mlperf.model_copy(
        update={
            "nexp": 1,
            "clear_caches": False,
            "comm_test": False,
            "verify_mounts": False,
            "check_compliance": False,
        }
    )
    update: dict[str, object] = {"nodes": 1, "gpus_per_node": 1, "slurm": slurm, "mlperf": mlperf}
    if mounts and system.container.runtime != "none":
        update["container"] = system.container.model_copy(
            update={"mounts": [*system.container.mounts, *mounts]}
        )
    return system.model_copy(update=update)


def submit_evaluation(
    options: "EvalOptions", system: str, sets: list[str], runs_dir: Path | None, dry_run: bool
) -> tuple["Launched", Path]:
    """The job evaluates options, written with absolute paths into its run directory (OPTIONS_FILE). A
    target that is not a run gets its output there too (results/eval.json) unless --output names a file:
    the job's folder and its output are one place. Returns what started and the JSON the job writes (a
    run's results/eval_<k>.json: k is chosen when it is written). The folders made for it here (the run
    folder's parents, the output's folder) go again if sbatch refuses it."""
    from flux_cluster.atomic import write_atomic
    from flux_cluster.config import load_system
    from flux_cluster.evaluate import OPTIONS_FILE
    from flux_cluster.evaluate.clip import clip_mount, find_clip
    from flux_cluster.evaluate.options import options_to_json
    from flux_cluster.evaluate.run import output_paths, pipeline_folder, read_prompts
    from flux_cluster.evaluate.target import resolve_target
    from flux_cluster.launch.folders import make_folders, remove_made
    from flux_cluster.launch.plan import make_plan
    from flux_cluster.launch.submit import check_slurm_path, launch_plan, require_slurm
    from flux_cluster.rundir import create_run_dir, eval_file, results_dir, runs_root

    config = load_system(system, sets).config
    require_slurm(config)
    target = resolve_target(options.target, options.exp)
    pipeline = pipeline_folder(target, options.model)
    read_prompts(options.prompts)
    clip = find_clip(pipeline, options.clip)
    named = None  # where the job writes outside its own folder: a run's results/, or --output's folder
    if target.run_dir is not None or options.output is not None:  # (output_paths refuses both at once)
        named = output_paths(target, options.output, Path())[0].parent
    # a CLIP from the Hugging Face cache: its snapshot's files link into the repository's blobs/
    clip_source = clip_mount(clip.absolute())
    prompts = options.prompts.absolute() if options.prompts else None
    read_only = [options.target.absolute(), pipeline.absolute(), clip_source, prompts, target.data_root]
    mounts = [f"{p}:{p}:ro" for p in read_only if p is not None]
    if named is not None:
        mounts.append(f"{named.absolute()}:{named.absolute()}")
    for mount in mounts:
        check_slurm_path(Path(mount.split(":")[0]))  # they become mount specifications: no ':' or ','
    config = evaluate_slurm_system(config, tuple(mounts))
    root = runs_root(runs_dir, config).absolute()
    check_slurm_path(root)
    # a container mount's source must exist
    made = make_folders([root / "evaluate", *([named] if named is not None and not dry_run else [])])
    try:
        run_dir = create_run_dir(root, "evaluate", config.name)
        plan = make_plan(config, "evaluate", run_dir, "evaluate", 0, extra_minutes=JOB_MINUTES)
        if target.run_dir is None:
            output = written = (options.output or results_dir(run_dir) / "eval.json").absolute()
        else:  # the job picks the run's first free results/eval_<k>.json when it writes
            output, written = None, eval_file(target.run_dir.absolute(), "<k>")
        absolute = dataclasses.replace(
            options,
            target=options.target.absolute(),
            model=pipeline.absolute(),
            prompts=prompts,
            clip=clip.absolute(),
            output=output,
        )

        def write_options(run_dir: Path) -> None:
            document = {"options": options_to_json(absolute)}
            write_atomic(run_dir / OPTIONS_FILE, json.dumps(document, indent=1) + "\n")

        launched = launch_plan(plan, dry_run=dry_run, prepare=write_options)
    except BaseException:
        remove_made(made)
        raise
    return launched, written
