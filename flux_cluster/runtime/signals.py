"""The checkpoint-and-requeue protocol between the ranks and the job script (no torch here).

Slurm sends SIGUSR1 ``signal_lead_s`` before the time limit. Every rank sets a flag; the job agrees
collectively to stop, checkpoints, and rank 0 writes the marker file named by $FLUX_REQUEUE_MARKER.
All ranks then exit 0 (a non-zero exit would make ``srun --kill-on-bad-exit`` kill the slower ranks
mid-checkpoint); the job script sees the marker and runs ``scontrol requeue``.

In docker/podman containers 'exec' forwards no signals, so the batch shell receives SIGUSR1 and runs
``python -m flux_cluster.jobs.signals relay`` (``relay`` here) in each container, which signals exactly
the ranks that registered their PID (DataLoader workers and other helpers are left alone).
"""

import ctypes
import os
import signal
from pathlib import Path

from flux_cluster.atomic import write_atomic
from flux_cluster.runtime.exit_codes import INTERRUPTED_EXIT_CODE

MARKER_ENV = "FLUX_REQUEUE_MARKER"
PID_DIR_ENV = "FLUX_PID_DIR"


class StopRequest:
    """Set by SIGUSR1 (the time-limit warning: checkpoint and requeue) or, when installed for it, SIGTERM
    (cancel or preemption: checkpoint and exit; Slurm requeues preempted jobs itself). The job polls
    ``requested`` at points where all ranks can agree to stop."""

    def __init__(self, on_sigterm: bool = False) -> None:
        self.requested = False
        self.requeue = False
        """True when SIGUSR1 asked for the stop: the job script should requeue the job."""
        self._signals = [signal.SIGUSR1, *([signal.SIGTERM] if on_sigterm else [])]

    def _handle(self, signum: int, frame: object) -> None:
        self.requested = True
        self.requeue = self.requeue or signum == signal.SIGUSR1

    def install(self) -> "StopRequest":
        for signum in self._signals:
            signal.signal(signum, self._handle)
        pid_dir = os.environ.get(PID_DIR_ENV)
        if pid_dir:
            write_atomic(Path(pid_dir) / f"{os.getpid()}.pid", f"{os.getpid()}\n")
        return self


_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Have the kernel send signum to this process when its parent exits (Linux prctl PR_SET_PDEATHSIG),
    so a killed launcher takes its children with it instead of leaving them running. Call it first
    thing in the child (or in a Popen preexec_fn)."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        return  # not Linux, or refused: nothing more to do than before
    if os.getppid() != parent or parent == 1:  # the parent was gone before the request took effect
        os.kill(os.getpid(), signum)


def under_torchrun() -> bool:
    """torchrun's agent started this process (it starts ranks in their own sessions)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def finish_interrupted(rank: int, requeue: bool = True) -> int:
    """After the checkpoint: ask the job script to requeue (rank 0) and return this rank's exit code."""
    marker = os.environ.get(MARKER_ENV)
    if marker is None or not requeue:
        return INTERRUPTED_EXIT_CODE
    if rank == 0:
        write_atomic(Path(marker), f"{os.environ.get('SLURM_JOB_ID', '')}\n")
    return 0


def relay(pid_dir: Path) -> int:
    """Send SIGUSR1 to every registered rank in this container; returns how many were signalled."""
    sent = 0
    for pid_file in sorted(pid_dir.glob("*.pid")):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGUSR1)
            sent += 1
        except (ValueError, ProcessLookupError):
            pid_file.unlink(missing_ok=True)  # a rank that already exited
    return sent
