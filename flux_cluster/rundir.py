"""Run directories: ``runs/<experiment>/<timestamp>-<system>/`` with the resolved config, the rendered
script, the job ids and the logs. Everything is written atomically.

The layout (README: Run directories) is the contract between the ranks that write a run folder and the
launcher side that reads it (report, sweep, API, tracking): every path in it is a function here, so
neither side spells a file name of its own. Foundations and config only: both sides import it.
"""

import errno
import fcntl
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from flux_cluster.atomic import write_atomic
from flux_cluster.config.schema import SystemConfig
from flux_cluster.errors import FluxClusterError
from flux_cluster.safe_text import printable

RUNS_ENV = "FLUX_CLUSTER_RUNS"
CONFIG_FILE = "config.yaml"
SCRIPT_FILE = "job.sh"
JOBS_FILE = "jobs.json"
STATE_DIR = "state"
RESULTS_DIR = "results"
SLURM_DIR = "slurm"
CHECKPOINTS_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
INTERRUPTED_DIR = "interrupted"
THROUGHPUT_FILE = "throughput.json"
LOCAL_LOG = "local.log"
RESULT_PREFIX = "result_"

# Slurm's job id forms: 123, an array task 123_4 or a range 123_[0-9%2], a het job component 123+1.
# ASCII only: anything else (an id such as '--me' read from a run folder) would be an option to scancel.
JOB_ID = re.compile(r"[0-9]+(_[0-9]+|_\[[0-9,%-]+\]|\+[0-9]+)?", re.ASCII)


def config_file(run_dir: Path) -> Path:
    """config.yaml: the resolved system config and the job's settings, read by every rank."""
    return run_dir / CONFIG_FILE


def script_file(run_dir: Path) -> Path:
    """job.sh: the rendered job script, byte-identical to what Slurm runs."""
    return run_dir / SCRIPT_FILE


def jobs_file(run_dir: Path) -> Path:
    """jobs.json: the launcher, the job ids and the submission time (RunRecord)."""
    return run_dir / JOBS_FILE


def slurm_dir(run_dir: Path) -> Path:
    """slurm/: the jobs' stdout/stderr (submitit's <jobid>_0_log.out layout)."""
    return run_dir / SLURM_DIR


def local_log(run_dir: Path) -> Path:
    """slurm/local.log: a local run's stdout and stderr together."""
    return slurm_dir(run_dir) / LOCAL_LOG


def results_dir(run_dir: Path) -> Path:
    """results/: every repeat's logs, metrics, weights and records."""
    return run_dir / RESULTS_DIR


def result_log(run_dir: Path, exp: int | str) -> Path:
    """results/result_<i>.txt: repeat i's MLPerf log."""
    return results_dir(run_dir) / f"{RESULT_PREFIX}{exp}.txt"


def set_aside_interrupted_log(path: Path) -> None:
    """Every attempt starts a new result log (one run_start each): an earlier attempt's log at path (or
    another file of it: the hf workload's metrics) moves to interrupted/ as <stem>.attempt<n><suffix>."""
    if not path.exists():
        return
    folder = path.parent / INTERRUPTED_DIR
    folder.mkdir(exist_ok=True)
    attempt = len(list(folder.glob(f"{path.stem}.attempt*{path.suffix}")))
    path.rename(folder / f"{path.stem}.attempt{attempt}{path.suffix}")


def repeat_of(result_log_path: Path) -> str:
    """The <i> of a results/result_<i>.txt name (whatever follows result_), for the files beside it."""
    return result_log_path.stem.removeprefix(RESULT_PREFIX)


def compliance_log(run_dir: Path, exp: int | str) -> Path:
    """results/compliance_<i>.log: the MLPerf compliance checker's output on repeat i's log."""
    return results_dir(run_dir) / f"compliance_{exp}.log"


def metrics_file(run_dir: Path, exp: int | str) -> Path:
    """results/metrics_<i>.jsonl: repeat i's every step, every evaluation and a fine-tuning summary."""
    return results_dir(run_dir) / f"metrics_{exp}.jsonl"


def best_weights_name(exp: int | str) -> str:
    """best_<i>: the folder name of repeat i's best fine-tuned weights, inside results/."""
    return f"best_{exp}"


def best_dir(run_dir: Path, exp: int | str) -> Path:
    """results/best_<i>/: repeat i's fine-tuned weights with the lowest validation loss."""
    return results_dir(run_dir) / best_weights_name(exp)


def preflight_file(run_dir: Path, exp: int | str) -> Path:
    """results/preflight_<i>.json: repeat i's preflight record."""
    return results_dir(run_dir) / f"preflight_{exp}.json"


def throughput_file(run_dir: Path) -> Path:
    """results/throughput.json: a throughput job's one record."""
    return results_dir(run_dir) / THROUGHPUT_FILE


def eval_file(run_dir: Path, key: str) -> Path:
    """results/eval_<k>.json: a 'flux-cluster evaluate' result (key "{k}": k is fixed when written)."""
    return results_dir(run_dir) / f"eval_{key}.json"


def interrupted_dir(run_dir: Path) -> Path:
    """results/interrupted/: the result log of every earlier attempt (a requeue, a crash)."""
    return results_dir(run_dir) / INTERRUPTED_DIR


def checkpoints_dir(run_dir: Path, checkpoint_root: str | Path | None = None) -> Path:
    """checkpoints/ (or train.checkpoint_dir when set): every repeat's sharded checkpoints."""
    return Path(checkpoint_root) if checkpoint_root else run_dir / CHECKPOINTS_DIR


def repeat_checkpoints_dir(checkpoints: Path, exp: int | str) -> Path:
    """exp_<i>/ under the checkpoints folder: repeat i's step_XXXXXXXX checkpoints."""
    return checkpoints / f"exp_{exp}"


def tensorboard_dir(run_dir: Path, exp: int | str) -> Path:
    """tensorboard/exp_<i>/: repeat i's TensorBoard scalars."""
    return run_dir / TENSORBOARD_DIR / f"exp_{exp}"


def state_dir(run_dir: Path) -> Path:
    """state/: hostfiles, finished-repeat markers, per-repeat locks, resumable progress."""
    return run_dir / STATE_DIR


def repeat_done_file(run_dir: Path, exp: int | str) -> Path:
    """state/exp_<i>.done: the job script's mark that repeat i ended well."""
    return state_dir(run_dir) / f"exp_{exp}.done"


def cancelled_file(run_dir: Path) -> Path:
    """state/cancelled: 'flux-cluster cancel' stopped this local run."""
    return state_dir(run_dir) / "cancelled"


def soak_state_file(run_dir: Path, exp: int | str) -> Path:
    """state/preflight_soak_<i>.json: repeat i's preflight soak progress, kept across a requeue."""
    return state_dir(run_dir) / f"preflight_soak_{exp}.json"


def runs_root(cli_value: Path | None, system: SystemConfig | None = None) -> Path:
    """--runs-dir, then $FLUX_CLUSTER_RUNS, then the system's paths.log_root, then ./runs."""
    if cli_value is not None:
        return cli_value
    if os.environ.get(RUNS_ENV):
        return Path(os.environ[RUNS_ENV])
    if system is not None and system.paths.log_root:
        return Path(system.paths.log_root)
    return Path("runs")


def create_run_dir(root: Path, experiment: str, system_name: str) -> Path:
    parent = (root / experiment).absolute()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1, 1000):
        path = parent / (f"{stamp}-{system_name}" + ("" if attempt == 1 else f"-{attempt}"))
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError as exc:
            raise FluxClusterError(f"{parent}: cannot create the run directory: {exc.strerror}") from None
        return path
    raise FluxClusterError(f"{parent}: too many runs started in the same second")


def write_run_config(run_dir: Path, system: SystemConfig, job: dict[str, Any]) -> Path:
    from flux_cluster import __version__

    document = {"flux_cluster_version": __version__, "job": job, "system": system.model_dump(mode="json")}
    path = config_file(run_dir)
    write_atomic(path, yaml.safe_dump(document, sort_keys=False))
    return path


def read_run_config(path: Path) -> tuple[SystemConfig, dict[str, Any]]:
    from flux_cluster.config.loader import load_yaml_safely

    document = load_yaml_safely(path)
    return SystemConfig.model_validate(document["system"]), document["job"]


@dataclass
class RunRecord:
    """What jobs.json holds: how the run was launched and under which ids."""

    launcher: str
    job_ids: list[str]
    submitted_at: float
    array: bool = False
    pid: int | None = None
    exit_code: int | None = None

    def save(self, run_dir: Path) -> None:
        write_atomic(jobs_file(run_dir), json.dumps(self.__dict__, indent=2) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> "RunRecord | None":
        """The run's jobs.json, every field checked (it comes from a folder anyone may have written: an
        id such as '--me' would become a Slurm option, a pid 'self' a signal to the wrong process); any
        problem is one OutsideFileError line naming the file and the key."""
        from flux_cluster.outside import OutsideFileError, read_json_object

        path = jobs_file(run_dir)
        if not path.exists() and not path.is_symlink():
            return None
        data = read_json_object(path, inside=run_dir)
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise OutsideFileError(
                f"{path}: unknown key {printable(unknown[0])!r}; not a flux-cluster jobs file"
            )
        missing = [name for name in ("launcher", "job_ids", "submitted_at") if name not in data]
        if missing:
            raise OutsideFileError(f"{path}: {missing[0]}: missing; not a flux-cluster jobs file")
        return cls(**{name: _checked(path, name, data) for name in cls.__dataclass_fields__ if name in data})


LAUNCHERS = ("slurm", "local", "dry-run")
MAX_PID = 2**22  # Linux's pid_max limit


def _checked(path: Path, key: str, data: dict[str, Any]) -> Any:
    """One jobs.json field, of the type and range RunRecord needs."""
    from flux_cluster.outside import OutsideFileError

    value = data[key]
    ok = {
        "launcher": lambda v: v in LAUNCHERS,
        "job_ids": lambda v: (
            type(v) is list
            and len(v) <= 100_000
            and all(isinstance(i, str) and JOB_ID.fullmatch(i) for i in v)
        ),
        "submitted_at": lambda v: type(v) in (int, float) and 0 <= v < 1e11,
        "array": lambda v: type(v) is bool,
        "pid": lambda v: v is None or (type(v) is int and 1 < v <= MAX_PID),
        "exit_code": lambda v: v is None or (type(v) is int and -256 < v < 256),
    }[key](value)
    if not ok:
        expected = {
            "launcher": f"one of {', '.join(LAUNCHERS)}",
            "job_ids": "a list of Slurm job ids (digits, optionally _N, _[...] or +N)",
            "submitted_at": "a time in seconds",
            "array": "true or false",
            "pid": f"null or a process id (2..{MAX_PID})",
            "exit_code": "null or an exit code",
        }[key]
        try:
            shown = printable(json.dumps(value)[:60])
        except (ValueError, RecursionError):
            shown = type(value).__name__
        raise OutsideFileError(f"{path}: {key}: expected {expected}, found {shown}")
    return value


def list_runs(root: Path) -> list[Path]:
    """Run directories under root, oldest first (their names start with the launch time); never a hidden
    folder (one being removed)."""
    if not root.is_dir():
        return []
    found = [p.parent for p in root.glob(f"*/*/{CONFIG_FILE}") if not p.parent.name.startswith(".")]
    return sorted(found, key=lambda p: (p.name, p.parent.name))


def resolve_run(spec: str | None, root: Path) -> Path:
    """A run by path, by '<experiment>/<name>', by unique name suffix, or the latest when None."""
    runs = list_runs(root)
    if spec is None:
        # the latest run that started (or was prepared): a folder without jobs.json never did
        started = [r for r in runs if jobs_file(r).exists()]
        if runs and not started:
            raise FluxClusterError(f"no run under {root} was started (none has a jobs.json); name one")
        if not started:
            raise FluxClusterError(f"no runs under {root}; submit one with 'flux-cluster submit'")
        return started[-1]
    as_path = Path(spec)
    if config_file(as_path).is_file():
        return as_path.absolute()
    wanted = Path(spec).parts
    matches = [r for r in runs if r.parts[-len(wanted) :] == wanted or r.name.endswith(spec)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise FluxClusterError(f"run {spec!r}: no such run under {root} (see 'flux-cluster runs list')")
    raise FluxClusterError(f"run {spec!r} is ambiguous: {', '.join(m.name for m in matches)}")


def repeat_lock_path(run_dir: Path, exp_index: int | str) -> Path:
    """state/exp_<i>.lock: held by the attempt writing repeat i."""
    return state_dir(run_dir) / f"exp_{exp_index}.lock"


def repeat_done(run_dir: Path, exp_index: int) -> bool:
    """The job script marks a repeat finished (state/exp_<i>.done) after it ended well."""
    return repeat_done_file(run_dir, exp_index).exists()


def lock_repeat(run_dir: Path, exp_index: int) -> IO[str] | None:
    """Hold an exclusive lock on one repeat of a run for as long as the returned file stays open (the
    process's life), so two attempts never write the same repeat at once. Another holder is a one-line
    FluxClusterError naming it; None where the file system has no locks (nothing is enforced there)."""
    path = repeat_lock_path(run_dir, exp_index)
    try:
        return exclusive_lock(path)
    except LockHeld as held:
        raise FluxClusterError(
            f"{path}: another attempt of repeat {exp_index} is still running ({held.holder}); stop it "
            "('flux-cluster cancel') or let it finish, then start again"
        ) from None


class LockHeld(Exception):
    """Another process holds the lock; holder says which ('pid N on HOST')."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


def exclusive_lock(path: Path) -> IO[str] | None:
    """An exclusive flock on path, held while the returned file stays open, the file naming its holder.
    LockHeld when another process holds it; None where the file system has no locks (nothing is
    enforced there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise LockHeld(holder) from None
        return None  # ENOLCK, EOPNOTSUPP, ENOSYS: e.g. a Lustre mounted without flock
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    return handle


def lock_held(path: Path) -> bool:
    """Whether a process on this machine holds a lock on path, read from /proc/locks: asking with a
    lock of our own could make a starting attempt see it as taken."""
    return bool(_locks_on(path))


def lock_holder_pids(path: Path) -> list[int]:
    """The processes holding a lock on path (from /proc/locks), each a checked pid (2..pid_max)."""
    return [pid for pid in _locks_on(path) or [] if 1 < pid <= MAX_PID]


def _locks_on(path: Path) -> list[int] | None:
    """The pid column of /proc/locks for every lock held on path (not waited for); None: unknown."""
    try:
        stat = path.stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    wanted = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    pids = []
    for line in table.splitlines():
        fields = line.split()
        if "->" not in line and wanted in fields:
            pid = fields[fields.index(wanted) - 1]
            pids.append(int(pid) if pid.isascii() and pid.lstrip("-").isdigit() else -1)
    return pids
