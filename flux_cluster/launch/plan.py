"""Everything a job script needs, computed once in Python so the templates stay declarative; and the job
registry: which ``python -m`` module (under flux_cluster/jobs/, named here, never imported) each job runs."""

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from flux_cluster import __version__, rundir
from flux_cluster.config.schema import SystemConfig
from flux_cluster.data.prep.stages import ENCODE_STAGES
from flux_cluster.errors import FluxClusterError
from flux_cluster.mlperf_rules import COMPLIANCE_STEP


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
        module="flux_cluster.jobs.train",
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
        module="flux_cluster.jobs.evaluate",
        description="flux-cluster evaluate: inference latency, CLIP score, samples (one rank, one GPU)",
        writes_mlperf_log=False,
        run_minutes_from_system=False,
    ),
}


COMPLIANCE_MODULE = COMPLIANCE_STEP
"""The step a job runs after each repeat whose result log MLPerf scores (JobPlan.checks_compliance): the
official checker, one line (``python -m MODULE --ruleset R --log-output FILE RESULT_LOG``); named in
mlperf_rules, whose old ``check`` entry (older job scripts) starts it too."""


def data_job(stage: str) -> JobKind:
    """The Slurm job of one prepare-data or data encode stage (see flux_cluster/launch/data_jobs.py)."""
    command = "data encode" if stage in ENCODE_STAGES else "prepare-data"
    return JobKind(
        name=f"data-{stage}",
        module="flux_cluster.jobs.data",
        description=f"{command}: the {stage} stage",
        writes_mlperf_log=False,
        run_minutes_from_system=False,
        writes_data=True,
    )


@dataclass(frozen=True)
class JobPlan:
    system: SystemConfig
    job: JobKind
    run_dir: Path
    experiment: str
    seed_base: int
    job_args: tuple[str, ...] = ()
    """Extra arguments for the job module (e.g. preflight --soak-seconds 30)."""
    dependency: str | None = None
    extra_minutes: int = 0
    version: str = __version__
    python_fallback: str = field(default_factory=lambda: sys.executable)

    @property
    def config_path(self) -> Path:
        return rundir.config_file(self.run_dir)

    @property
    def slurm_dir(self) -> Path:
        return rundir.slurm_dir(self.run_dir)

    @property
    def results_dir(self) -> Path:
        return rundir.results_dir(self.run_dir)

    @property
    def python(self) -> str:
        """The interpreter in the job: the config's, else 'python' in containers, else this interpreter."""
        if self.system.python:
            return self.system.python
        return "python" if self.system.container.runtime != "none" else self.python_fallback

    @property
    def ranks_per_node(self) -> int:
        """Processes per node: one per GPU, but one for the hf workload's train.parallel 'dp' (DataParallel
        drives all of a node's GPUs from one process; flux_cluster/hf/parallel.py)."""
        one = self.job.name == "train" and self.system.train.parallel == "dp"
        return 1 if one else self.system.gpus_per_node

    @property
    def nexp(self) -> int:
        return self.system.mlperf.nexp

    @property
    def is_array(self) -> bool:
        return self.system.launcher == "slurm" and self.system.mlperf.nexp_mode == "array" and self.nexp > 1

    @property
    def array_spec(self) -> str:
        throttle = self.system.mlperf.array_parallelism
        return f"0-{self.nexp - 1}" + (f"%{throttle}" if throttle else "")

    @property
    def experiments_per_allocation(self) -> int:
        return 1 if self.is_array else self.nexp

    @property
    def run_minutes(self) -> int:
        base = self.system.mlperf.run_minutes if self.job.run_minutes_from_system else self.job.minutes
        return base + self.extra_minutes

    @property
    def walltime(self) -> str:
        """The system's walltime, or NVIDIA's WALLTIME = 5 + NEXP * (WALLTIME_RUNANDTIME + 5)."""
        if self.system.slurm.walltime:
            return self.system.slurm.walltime
        minutes = 5 + self.experiments_per_allocation * (self.run_minutes + 5)
        return f"{minutes // 60:02d}:{minutes % 60:02d}:00"

    @property
    def output_pattern(self) -> str:
        # submitit's JobPaths.stdout layout ({folder}/{job_id}_{task}_log.out), so its Job finds the logs.
        stem = "%A_%a" if self.is_array else "%j"
        return str(self.slurm_dir / f"{stem}_0_log.out")

    @property
    def error_pattern(self) -> str:
        return self.output_pattern.removesuffix(".out") + ".err"

    @property
    def signal_spec(self) -> str:
        # docker/podman exec forwards no signals: the batch shell gets it and relays it to the containers.
        relay = "B:" if self.container_per_node else ""
        return f"{relay}USR1@{self.system.slurm.signal_lead_s}"

    @property
    def checks_compliance(self) -> bool:
        """The job runs the MLPerf checker on each result log: only for the benchmark itself. A
        fine-tuning run is no MLPerf result (its log says division open, whose flux1 rules it cannot meet)."""
        mlperf_job = self.system.mlperf.check_compliance and self.job.writes_mlperf_log
        return mlperf_job and self.system.train.mode == "pretrain"

    @property
    def compliance_module(self) -> str:
        return COMPLIANCE_MODULE

    @property
    def requeues_after_a_crash(self) -> bool:
        """A rank killed by a signal requeues the job: only training, whose checkpoints by wall time bound
        what a crash costs. A preflight that lost a rank has found a fault to report, not to retry."""
        return self.system.slurm.requeue and self.job.writes_mlperf_log

    @property
    def container_per_node(self) -> bool:
        return self.system.container.runtime in ("docker", "podman")

    @property
    def data_dir(self) -> str | None:
        """The data root as the ranks see it (inside the container when there is one)."""
        paths = self.system.paths
        if paths.data_root is None:
            return None
        return paths.data_mount if self.system.container.runtime != "none" else paths.data_root

    @property
    def mounts(self) -> list[str]:
        """Bind mounts: the data root (read-only but for data jobs, which also get the source root), the run
        directory at the same path, then the config's."""
        paths, mounts = self.system.paths, []
        if paths.data_root:
            mounts.append(f"{paths.data_root}:{paths.data_mount}" + ("" if self.job.writes_data else ":ro"))
        if self.job.writes_data and paths.source_root:
            mounts.append(f"{paths.source_root}:{paths.source_mount}")
        mounts.append(f"{self.run_dir}:{self.run_dir}")
        return [*mounts, *self.system.container.mounts]

    @property
    def rank_env_names(self) -> list[str]:
        """Variables a docker/podman exec must forward by name: Slurm's per-task ones, ours, the config's."""
        slurm = [
            "SLURM_JOB_ID",
            "SLURM_PROCID",
            "SLURM_LOCALID",
            "SLURM_NODEID",
            "SLURM_NTASKS",
            "SLURM_NTASKS_PER_NODE",
            "SLURM_JOB_NUM_NODES",
            "SLURM_RESTART_COUNT",
            "SLURM_ARRAY_TASK_ID",
        ]
        ours = [
            "MASTER_ADDR",
            "MASTER_PORT",
            "FLUX_RUN_DIR",
            "FLUX_EXP_INDEX",
            "FLUX_SEED",
            "FLUX_RESULT_LOG",
            "FLUX_CACHE_CLEARED",
            "FLUX_DATA_DIR",
            "FLUX_REQUEUE_MARKER",
            "FLUX_PID_DIR",
        ]
        return [*slurm, *ours, *self.system.env, *self.system.secrets]

    def job_name(self) -> str:
        return f"flux-{self.job.name}-{self.system.name}"


def make_plan(
    system: SystemConfig,
    job: str,
    run_dir: Path,
    experiment: str,
    seed_base: int,
    job_args: tuple[str, ...] = (),
    dependency: str | None = None,
    extra_minutes: int = 0,
) -> JobPlan:
    if job not in JOBS:
        raise FluxClusterError(f"unknown job {job!r}; known jobs: {', '.join(JOBS)}")
    if dependency is not None:
        check_dependency(dependency)
    return JobPlan(
        system=system,
        job=JOBS[job],
        run_dir=run_dir,
        experiment=experiment,
        seed_base=seed_base,
        job_args=job_args,
        dependency=dependency,
        extra_minutes=extra_minutes,
    )


DEPENDENCY_KINDS = (
    "after", "afterany", "afterburstbuffer", "aftercorr", "afternotok", "afterok", "singleton",
)  # fmt: skip
"""What sbatch's --dependency takes (its man page; slurmctld compares the names case-insensitively):
TYPE:JOBID[:JOBID...], after's ids with +MINUTES, singleton alone, and a bare JOBID (afterany)."""
_JOB_ID = r"[0-9]+(?:_(?:[0-9]+|\*))?"  # a job, one task of an array, or every task (ID_*)
_DEPENDENCY = re.compile(
    rf"after:{_JOB_ID}(?:\+[0-9]+)?(?::{_JOB_ID}(?:\+[0-9]+)?)*"
    rf"|(?:afterany|afterburstbuffer|aftercorr|afternotok|afterok):{_JOB_ID}(?::{_JOB_ID})*"
    rf"|singleton|(?P<bare>{_JOB_ID})",
    re.IGNORECASE | re.ASCII,  # as strncasecmp: no other letter folds onto an ASCII one
)


def check_dependency(text: str) -> None:
    """A Slurm dependency as sbatch's --dependency takes it: TYPE:JOBID[:JOBID...] (after:JOBID+MINUTES,
    singleton, a bare JOBID), several joined by ',' (all must hold) or by '?' (any may), never both;
    anything else is one line. slurmctld reads a bare JOBID and the rest of the list as its oldest form
    (JOBID,JOBID,...): no TYPE: after one, and in a '?' list only the last part is bare."""
    separator = "?" if "?" in text else ","
    parts = [_DEPENDENCY.fullmatch(part) for part in text.split(separator)]
    bare = next((i for i, part in enumerate(parts) if part and part["bare"]), None)
    misplaced = bare is not None and (
        bare != len(parts) - 1 if separator == "?" else any(p and ":" in p[0] for p in parts[bare + 1 :])
    )
    if not all(parts) or misplaced:
        raise FluxClusterError(
            f"--dependency {text!r}: expected TYPE:JOBID[:JOBID...] or a bare JOBID (afterany), JOBID "
            "digits, ID_TASK or ID_* (every task of an array), several joined by ',' (all) or by '?' (any), "
            f"not both; TYPE one of {', '.join(DEPENDENCY_KINDS)} (after:JOBID+MINUTES; singleton alone); "
            "a bare JOBID only after the TYPE: parts, and last in a '?' list"
        )


@dataclass(frozen=True)
class ArrayPlan:
    """Sweep points that share their Slurm resources (the same #SBATCH lines: in practice the same node
    count) as one array: task i runs the job script of the point in run_dirs[i], in its own run directory,
    exactly as 'sbatch job.sh' would. Renders the same #SBATCH header as a job (sweep_array.sh.j2)."""

    first: JobPlan
    """The first point's plan: the allocation every task asks for."""
    run_dirs: tuple[Path, ...]
    folder: Path
    """The array's own folder: its script, and Slurm's output files (linked from each point's slurm/)."""
    name: str
    """The sweep's name, for the script's comment."""
    throttle: int | None = None
    """At most this many tasks at once (--array=...%N); None: all."""
    dependency: str | None = None
    version: str = __version__
    is_array: bool = True

    @property
    def system(self) -> SystemConfig:
        return self.first.system

    @property
    def walltime(self) -> str:
        return self.first.walltime

    @property
    def ranks_per_node(self) -> int:
        return self.first.ranks_per_node

    @property
    def signal_spec(self) -> str:
        return self.first.signal_spec

    @property
    def slurm_dir(self) -> Path:
        return self.folder / "slurm"

    @property
    def output_pattern(self) -> str:
        return str(self.slurm_dir / "%A_%a_0_log.out")

    @property
    def error_pattern(self) -> str:
        return self.output_pattern.removesuffix(".out") + ".err"

    @property
    def array_spec(self) -> str:
        return f"0-{len(self.run_dirs) - 1}" + (f"%{self.throttle}" if self.throttle else "")

    def job_name(self) -> str:
        return self.first.job_name()
