"""Run directories: ``runs/<experiment>/<timestamp>-<system>/`` with the resolved config, the rendered
script, the job ids and the logs. Everything is written atomically."""

import errno
import fcntl
import json
import os
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
    path = run_dir / CONFIG_FILE
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
        write_atomic(run_dir / JOBS_FILE, json.dumps(self.__dict__, indent=2) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> "RunRecord | None":
        """The run's jobs.json, every field checked (it comes from a folder anyone may have written: an
        id such as '--me' would become a Slurm option, a pid 'self' a signal to the wrong process); any
        problem is one OutsideFileError line naming the file and the key."""
        from flux_cluster.outside import OutsideFileError, read_json_object

        path = run_dir / JOBS_FILE
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
    from flux_cluster.launch.slurm import JOB_ID
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
    """Run directories under root, oldest first (their names start with the launch time)."""
    if not root.is_dir():
        return []
    found = [p.parent for p in root.glob(f"*/*/{CONFIG_FILE}")]
    return sorted(found, key=lambda p: (p.name, p.parent.name))


def resolve_run(spec: str | None, root: Path) -> Path:
    """A run by path, by '<experiment>/<name>', by unique name suffix, or the latest when None."""
    runs = list_runs(root)
    if spec is None:
        # the latest run that started (or was prepared): a folder without jobs.json never did
        started = [r for r in runs if (r / JOBS_FILE).exists()]
        if runs and not started:
            raise FluxClusterError(f"no run under {root} was started (none has a jobs.json); name one")
        if not started:
            raise FluxClusterError(f"no runs under {root}; submit one with 'flux-cluster submit'")
        return started[-1]
    as_path = Path(spec)
    if (as_path / CONFIG_FILE).is_file():
        return as_path.absolute()
    wanted = Path(spec).parts
    matches = [r for r in runs if r.parts[-len(wanted) :] == wanted or r.name.endswith(spec)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise FluxClusterError(f"run {spec!r}: no such run under {root} (see 'flux-cluster runs list')")
    raise FluxClusterError(f"run {spec!r} is ambiguous: {', '.join(m.name for m in matches)}")


def repeat_lock_path(run_dir: Path, exp_index: int) -> Path:
    return run_dir / STATE_DIR / f"exp_{exp_index}.lock"


def repeat_done(run_dir: Path, exp_index: int) -> bool:
    """The job script marks a repeat finished (state/exp_<i>.done) after it ended well."""
    return (run_dir / STATE_DIR / f"exp_{exp_index}.done").exists()


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
