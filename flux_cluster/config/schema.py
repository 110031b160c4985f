"""Typed system configuration. Every field carries its documentation as an attribute docstring.

Values that end up in ``#SBATCH`` lines are restricted to characters the shell never needs to quote,
so a directive cannot be split or extended; every other string is shell-quoted when rendered.
"""

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from flux_cluster.config.hf import HfConfig
from flux_cluster.config.image_names import REGISTRY, default_image, is_file_image
from flux_cluster.config.reserved import env_name_problem
from flux_cluster.config.section import SECTION
from flux_cluster.config.training import TrainConfig
from flux_cluster.mlperf_rules import Ruleset

# Pydantic matches these patterns with Rust's regex, where '$' is the end of the text only (a trailing
# newline fails); Python code matching a pattern uses re.fullmatch, since Python's '$' accepts one.
# Characters shlex.quote leaves alone: safe inside an #SBATCH line without quoting.
SafeToken = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_@%+=:,./-]+$")]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
UserEnvName = Annotated[EnvName, AfterValidator(lambda v: _check_env_name(v))]
EnvValue = Annotated[str, AfterValidator(lambda v: _check_env_value(v))]
# A single path component for names that become file names (and #SBATCH values).
PLAIN_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
PlainName = Annotated[str, StringConstraints(pattern=PLAIN_NAME_PATTERN)]
_WALLTIME = re.compile(r"\d+|\d+:\d{2}:\d{2}|\d+-\d{1,2}(:\d{2}){0,2}", re.ASCII)  # ASCII digits only


def _check_walltime(value: str) -> str:
    # 'MM:SS' is refused: '12:00' reads as twelve minutes to Slurm, rarely what was meant.
    if not _WALLTIME.fullmatch(value):
        raise ValueError("expected minutes, H:MM:SS or D-HH[:MM[:SS]], e.g. 90, 12:00:00 or 1-00:00:00")
    return value


Walltime = Annotated[str, AfterValidator(_check_walltime)]
MemSize = Annotated[str, StringConstraints(pattern=r"^[0-9]+[KMGT]?$")]
# Directives the renderer owns: an extra_sbatch copy would silently break logs, arrays, signals or secrets.
_OWNED_DIRECTIVES = {
    "--output",
    "--error",
    "--array",
    "--job-name",
    "--export",
    "--signal",
    "--requeue",
    "--no-requeue",
    "--nodes",
    "--ntasks-per-node",
    "--time",
    "--open-mode",
    "--dependency",
    "--kill-on-invalid-dep",
}


def _check_directive(value: str) -> str:
    if value.split("=", 1)[0] in _OWNED_DIRECTIVES:
        raise ValueError(
            f"{value.split('=', 1)[0]} is set by flux-cluster itself; use the matching config key"
        )
    return value


def _check_env_name(value: str) -> str:
    # Names the job scripts use (read from the templates) or bash reads: see flux_cluster/config/reserved.py.
    problem = env_name_problem(value)
    if problem:
        raise ValueError(f"{problem}; it cannot come from the config")
    return value


def _check_env_value(value: str) -> str:
    if "\0" in value:
        raise ValueError("a NUL character cannot be in an environment variable")
    return value


SbatchDirective = Annotated[
    str,
    StringConstraints(pattern=r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_@%+=:,./-]+)?$"),
    AfterValidator(_check_directive),
]


def _check_mount(value: str) -> str:
    parts = value.split(":")
    if not 2 <= len(parts) <= 3 or not all(parts[:2]) or "," in value or "\n" in value:
        raise ValueError("expected 'SRC:DST' or 'SRC:DST:OPTS' with no commas")
    if not parts[1].startswith("/"):
        raise ValueError("the mount target (after ':') must be an absolute path")
    return value


Mount = Annotated[str, AfterValidator(_check_mount)]


class _Section(BaseModel):
    # '--set slurm.walltime=90' arrives as an int: text fields take numbers as their decimal text.
    model_config = ConfigDict(**SECTION, coerce_numbers_to_str=True)


class SlurmConfig(_Section):
    partition: SafeToken | None = None
    """Slurm partition (sbatch --partition); None uses the cluster's default partition."""
    account: SafeToken | None = None
    """Slurm account to charge (sbatch --account)."""
    qos: SafeToken | None = None
    """Quality of service (sbatch --qos)."""
    walltime: Walltime | None = None
    """Time limit (minutes, HH:MM:SS or D-HH:MM:SS). None derives it from mlperf.run_minutes as NVIDIA does:
    5 + N * (run_minutes + 5), with N the experiments that share one allocation."""
    exclusive: bool = True
    """Ask for whole nodes (sbatch --exclusive)."""
    gres_gpus: bool = True
    """Request the GPUs as GRES (--gpus-per-node); false where whole nodes come without GRES."""
    cpus_per_task: int | None = Field(default=None, ge=1)
    """CPU cores per task (one task per GPU)."""
    mem: MemSize | None = None
    """Memory per node (sbatch --mem); '0' asks for all of it."""
    mem_per_cpu: MemSize | None = None
    """Memory per CPU core (sbatch --mem-per-cpu), an alternative to mem."""
    one_gpu_mem: MemSize | None = None
    """Memory of a job that uses one GPU of a node (the evaluate job; not --exclusive, so the node's other
    GPUs stay free for other jobs). None: mem divided by gpus_per_node when mem is a size; with mem '0'
    or unset, no --mem (Slurm's per-CPU default)."""
    one_gpu_cpus: int | None = Field(default=None, ge=1)
    """CPU cores of a one-GPU job. None: cpus_per_task (already one GPU's share: one task per GPU)."""
    requeue: bool = True
    """Let the job requeue itself after it checkpointed on the time-limit signal, and a training job after
    a rank was killed by a signal (a node crash, the OOM killer): it resumes from its last checkpoint."""
    max_requeues: int = Field(default=3, ge=0, le=1000)
    """How often a training run may requeue itself after a rank was killed by a signal (counted per run in
    its state/ folder); past it the job fails with one line saying so, so a fault that recurs at every
    start cannot loop. Time-limit (SIGUSR1) requeues are not counted: each checkpointed progress. 0: never
    after a crash."""
    signal_lead_s: int = Field(default=300, ge=10, le=65535)
    """Seconds before the time limit at which Slurm sends SIGUSR1 (sbatch --signal=USR1@lead)."""
    extra_sbatch: list[SbatchDirective] = []
    """Additional sbatch directives, e.g. '--reservation=mlperf' or '--constraint=gb200'."""
    srun_args: list[SafeToken] = []
    """Additional arguments for every training srun, e.g. '--mpi=pmix' or '--cpu-bind=none'."""

    @model_validator(mode="after")
    def _one_memory_form(self) -> "SlurmConfig":
        if self.mem is not None and self.mem_per_cpu is not None:
            raise ValueError("set either mem or mem_per_cpu, not both")
        return self


class ContainerConfig(_Section):
    runtime: Literal["pyxis", "docker", "podman", "none"] = "none"
    """How ranks start: Pyxis/enroot containers, one docker/podman container per node, or bare metal."""
    image: str | None = None
    """Container image: a registry reference (pyxis 'nvcr.io#nvidia/pytorch:25.09-py3'), an absolute .sqsh
    path, or a docker/podman image name. Empty: the image 'flux-cluster image build' makes for this
    version and vendor (in image_dir for pyxis, else from registry, else the local name)."""
    image_dir: str | None = None
    """Folder of .sqsh images on a shared file system (pyxis): the default image is
    '<image_dir>/flux-cluster+<version>-<vendor>.sqsh', the file 'image build --sqsh <image_dir>' writes."""
    registry: str | None = None
    """Registry the built images are pushed to ('image build --push REGISTRY'), e.g.
    'registry.example.com/mlperf'; the default image is pulled from there when image_dir is not set."""

    @field_validator("image", "image_dir", "registry", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value  # '${FLUX_CLUSTER_IMAGE:-}' left empty: use the default

    @field_validator("registry")
    @classmethod
    def _registry_form(cls, value: str | None) -> str | None:
        if value is not None and not REGISTRY.fullmatch(value):
            raise ValueError(
                "expected a registry host with an optional path, e.g. 'registry.example.com/mlperf'"
            )
        return value

    @field_validator("image")
    @classmethod
    def _sqsh_is_a_path(cls, value: str | None) -> str | None:
        if value is not None and value.endswith(".sqsh") and not is_file_image(value):
            raise ValueError(
                "a .sqsh file must be an absolute path (Pyxis pulls anything not starting with '/' or './')"
            )
        return value

    mounts: list[Mount] = []
    """Extra bind mounts 'SRC:DST[:OPTS]'. The data root and the run directory are mounted automatically."""
    workdir: str = "/workspace/flux-cluster"
    """Working directory inside the container."""
    name: PlainName = "flux-cluster"
    """Container name prefix; the job id is appended, so Pyxis reuses one container across the job's steps."""
    run_args: list[str] = []
    """Extra 'docker/podman run' arguments, e.g. '--shm-size=64g' (ignored by pyxis)."""


def _check_mountable(value: str | None) -> str | None:
    if value is not None and any(c in value for c in ",:\n"):
        raise ValueError("it becomes part of a bind-mount spec: no ',', ':' or newline")
    return value


MountablePath = Annotated[str | None, AfterValidator(_check_mountable)]


def _check_search_dir(value: str) -> str:
    # joined with ':' into PATH / LD_LIBRARY_PATH: one absolute folder, no separator or control character
    if not value.startswith("/") or ":" in value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("expected an absolute folder with no ':' or control character, e.g. /opt/site/bin")
    return value


SearchDir = Annotated[str, AfterValidator(_check_search_dir)]


class PathsConfig(_Section):
    data_root: MountablePath = None
    """Host path of the Energon dataset root (train/, val/, empty_encodings/, .nv-meta/)."""
    data_mount: MountablePath = "/data"
    """Where the data root appears inside the container."""
    log_root: str | None = None
    """Default parent of run directories on this system (a shared file system on clusters)."""
    source_root: MountablePath = None
    """Host path of the MLCommons preprocessed download (cc12m_preprocessed/, coco_preprocessed/,
    empty_encodings/): the input of 'flux-cluster prepare-data'."""
    source_mount: MountablePath = "/source"
    """Where the source root appears inside the container during data preparation."""
    extra_path: list[SearchDir] = []
    """Absolute folders put before PATH in the job script (the batch shell and bare-metal ranks), e.g. a
    site's Slurm or tool folder; env.PATH is refused, since it would pick every command the script runs."""
    extra_library_path: list[SearchDir] = []
    """Absolute folders put before LD_LIBRARY_PATH in the job script (env.LD_* are refused)."""


class DataPrepConfig(_Section):
    shard_size: int = Field(default=10_000, ge=1)
    """Samples per output shard (NVIDIA's layout: 10,000, about 21.7 GB per train shard)."""
    tasks: int = Field(default=8, ge=1, le=1000)
    """Slurm array tasks that share the conversion, each taking a contiguous range of shards."""
    workers: int = Field(default=8, ge=1, le=512)
    """Processes per task (one shard each at a time); also the task's --cpus-per-task."""
    partition: SafeToken | None = None
    """Partition for data jobs (often a CPU partition); None uses slurm.partition."""
    walltime: Walltime = "04:00:00"
    """Time limit of the convert, index and verify jobs."""
    download_walltime: Walltime = "24:00:00"
    """Time limit of the download job (2.4 TB; NVIDIA's download.sub asks for 24 hours)."""
    mem: MemSize | None = None
    """Memory per data task (sbatch --mem); None: Slurm's per-CPU default, not the whole node."""


class InterconnectConfig(_Section):
    """How fast the accelerators exchange data, per accelerator and per direction, as the datasheets give it:
    what ``flux-cluster forecast`` turns the FSDP/HSDP collectives of a step into seconds with."""

    scale_up_gbps: float | None = Field(default=None, gt=0)
    """GB/s one accelerator sends (and receives) over the scale-up fabric, one direction: NVLink 5
    (B200, GB200) 900, NVLink 4 (H100, H200) 450, Infinity Fabric (MI300X, MI325X: 7 links x 64) 448.
    None: unknown (a forecast that needs it says so)."""
    scale_up_domain: int | None = Field(default=None, ge=1)
    """Accelerators that share one scale-up fabric (72 in a GB200 NVL72 rack); None: one node's
    (gpus_per_node)."""
    scale_out_gbps: float | None = Field(default=None, gt=0)
    """GB/s per accelerator, one direction, between scale-up domains: the node's NIC bandwidth over its
    accelerators (8x 400 Gb/s ConnectX-7 for 8 GPUs: 50). None: unknown (one-node systems need none)."""
    source: str | None = Field(default=None, max_length=300)
    """Where the figures come from (the datasheets, a measurement)."""


class MlperfConfig(_Section):
    nexp: int = Field(default=1, ge=1, le=1000)
    """Repeats of the benchmark (MLPerf needs 10 runs of flux1), each with its own log and seed."""
    nexp_mode: Literal["array", "serial"] = "array"
    """'array': a Slurm array task per repeat; 'serial': all repeats in one allocation (NVIDIA's run.sub)."""
    array_parallelism: int | None = Field(default=None, ge=1)
    """At most this many array tasks at once (sbatch --array=0-9%P)."""
    seed_base: int | None = Field(default=None, ge=0, lt=2**31)
    """Seed of repeat 0; repeat i uses seed_base + i. None draws one at submission and records it."""
    run_minutes: int = Field(default=60, ge=1)
    """Expected minutes per repeat, start-up included (NVIDIA's WALLTIME_RUNANDTIME)."""
    clear_caches: bool = False
    """Drop the page cache on every node before each repeat (MLPerf cache_clear; needs sudo on the nodes)."""
    comm_test: bool = False
    """Run an all_reduce bandwidth test (NCCL/RCCL/gloo) across all ranks before training."""
    verify_mounts: bool = True
    """Check on every node that the data root is mounted and readable before starting."""
    check_compliance: bool = True
    """Run the MLPerf compliance checker on every result log after its repeat."""
    ruleset: Ruleset = "6.1.0"
    """MLPerf Training ruleset the logs are checked against."""
    submission_org: str = "flux-cluster"
    """submission_org in the result logs: the submitting organisation."""


class SystemConfig(_Section):
    model_config = ConfigDict(**SECTION, coerce_numbers_to_str=True)

    name: PlainName
    """System name (the config file's name)."""
    description: str = ""
    """One line shown by 'flux-cluster systems list'."""
    launcher: Literal["slurm", "local"] = "slurm"
    """'slurm' submits batch jobs; 'local' runs the job's processes on this machine, no Slurm."""
    nodes: int = Field(ge=1)
    """Nodes per job."""
    gpus_per_node: int = Field(ge=1, le=64)
    """Accelerators per node; one rank each (on CPU-only systems: processes per node)."""
    gpu_model: str
    """Accelerator model, e.g. 'H100-SXM5-80GB'."""
    vendor: Literal["nvidia", "amd", "cpu"]
    """Accelerator vendor: selects CUDA/ROCm conventions (device files, NCCL vs RCCL tuning)."""
    peak_bf16_tflops: float = Field(ge=0)
    """Dense bf16 peak per accelerator in TFLOP/s, for MFU."""
    gpu_memory_gb: float | None = Field(default=None, gt=0)
    """Memory per accelerator in GB, the datasheet's (H100 80, H200 141, B200 180, MI300X 192): what
    train.activation_checkpointing 'auto' fits its choice into. None (CPU systems): 'auto' is 'full'."""
    price_per_gpu_hour: float = Field(default=0.0, ge=0)
    """Price of one accelerator-hour in USD, for cost reports."""
    price_date: str | None = Field(default=None, max_length=40)
    """When price_per_gpu_hour was taken (e.g. '2026-11'): list prices change, so say how old it is."""
    price_source: str | None = Field(default=None, max_length=300)
    """Where price_per_gpu_hour comes from (the provider's public price page, a contract)."""
    dist_backend: Literal["auto", "nccl", "gloo"] = "auto"
    """torch.distributed backend; 'auto' is nccl (RCCL on ROCm) with GPUs, gloo without."""
    python: str | None = None
    """Python command inside the job; None uses the interpreter that runs flux-cluster (bare metal)."""
    slurm: SlurmConfig = SlurmConfig()
    """Slurm allocation settings."""
    container: ContainerConfig = ContainerConfig()
    """Container runtime, image and mounts."""
    paths: PathsConfig = PathsConfig()
    """Data and log roots."""
    env: dict[UserEnvName, EnvValue] = {}
    """Environment for every rank (NCCL/RCCL tuning, site settings). Values are shell-quoted."""
    secrets: list[UserEnvName] = []
    """Names of secret variables (e.g. HF_TOKEN) passed from the submitting environment by name only."""
    mlperf: MlperfConfig = MlperfConfig()
    """MLPerf conventions: repeats, seeds, cache clearing, compliance."""
    data_prep: DataPrepConfig = DataPrepConfig()
    """How 'flux-cluster prepare-data' splits its work into Slurm jobs."""
    train: TrainConfig = TrainConfig()
    """How this system runs the training job: model, batch sizes, evaluation, checkpoints, parallelism."""
    hf: HfConfig = HfConfig()
    """The Hugging Face model, task and data of train.benchmark hf (flux_cluster/config/hf.py)."""
    interconnect: InterconnectConfig = InterconnectConfig()
    """Accelerator-to-accelerator bandwidth, for 'flux-cluster forecast' (docs in the section)."""

    @model_validator(mode="before")
    @classmethod
    def _default_image(cls, data: Any) -> Any:
        container = data.get("container") if isinstance(data, dict) else None
        if not isinstance(container, dict) or container.get("image") not in (None, ""):
            return data
        image_dir, registry = container.get("image_dir"), container.get("registry")
        image = default_image(
            str(data.get("vendor")),
            str(container.get("runtime", "none")),
            image_dir if isinstance(image_dir, str) else None,
            registry if isinstance(registry, str) else None,
        )
        return {**data, "container": {**container, "image": image}}

    @model_validator(mode="after")
    def _consistent(self) -> "SystemConfig":
        container = self.container
        if container.runtime != "none" and not container.image:
            raise ValueError(
                f"container.image is required with container.runtime {container.runtime!r} "
                "(or set container.image_dir or container.registry "
                "to run the image 'flux-cluster image build' makes)"
            )
        if self.launcher == "local" and (self.nodes != 1 or self.container.runtime != "none"):
            raise ValueError(
                "launcher 'local' runs on this machine: it needs nodes 1 and container.runtime none"
            )
        clash = set(self.secrets) & set(self.env)
        if clash:
            raise ValueError(f"{sorted(clash)} are secrets and cannot also have values in env")
        return self
