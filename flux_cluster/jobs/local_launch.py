"""torchrun for ``--system local``: the same launcher, but a rank that exits non-zero ends in one line
that names the outcome and keeps the rank's exit code (3: the target was not reached), instead of
torchrun's ChildFailedError traceback and exit code 1. The ranks print their own errors.

    python -m flux_cluster.jobs.local_launch [torchrun options] -m MODULE ARGS...
"""

import logging
import os
import signal
import sys

from flux_cluster.runtime.exit_codes import NOT_CONVERGED_EXIT_CODE
from flux_cluster.runtime.signals import die_with_parent


def outcome_line(exit_codes: dict[int, int], first_rank: int) -> tuple[str | None, int]:
    """The line to print (None: the rank already said why) and the exit code to keep, from each failed
    rank's exit code and the rank that failed first (torchrun then stops the others with SIGTERM, so their
    codes say nothing)."""
    first = exit_codes[first_rank]
    if first == NOT_CONVERGED_EXIT_CODE:
        return (
            "[train] the run ended without reaching the quality target: its sample budget "
            f"(train.max_samples) ran out (exit code {NOT_CONVERGED_EXIT_CODE})",
            NOT_CONVERGED_EXIT_CODE,
        )
    if first > 0:  # the rank exited on its own and printed its error: one line is already there
        return None, first
    ranks = ", ".join(f"rank {rank}: exit code {code}" for rank, code in sorted(exit_codes.items()))
    # killed by a signal (nothing of its own printed): report it the way a shell does
    return f"[launch] rank {first_rank} was killed by signal {-first} ({ranks})", 128 - first


def main(argv: list[str] | None = None) -> int:
    # A killed job.sh (kill -9) takes this agent with it, and the agent its ranks (they die with it):
    # SIGTERM, which the agent handles by stopping the ranks, rather than leaving them training.
    die_with_parent(signal.SIGTERM)
    no_stdin()
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    # torchrun's agent logs each failed rank at ERROR (and a stop signal at WARNING) before raising; our
    # line below says it once. Its modules' loggers carry their own levels: quiet each one.
    for name in [*logging.root.manager.loggerDict, "torch.distributed.elastic"]:
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    _stop_once()
    try:
        torchrun(argv if argv is not None else sys.argv[1:])
    except SignalException as exc:  # 'flux-cluster cancel', or job.sh killed: one line, not a traceback
        name = signal.Signals(exc.sigval).name
        print(f"[launch] stopped by {name}: the ranks were stopped", file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        first_rank, _ = exc.get_first_failure()
        codes = {rank: failure.exitcode for rank, failure in exc.failures.items()}
        line, code = outcome_line(codes, first_rank)
        if line is not None:
            print(line, file=sys.stderr, flush=True)
        return code
    return 0


def no_stdin() -> None:
    """torchrun and the ranks it starts read end-of-file from stdin, not a terminal or a pipe: a library's
    prompt (transformers' "run the custom code? [y/N]") is never answered by what a user types or pipes
    into a job script run by hand. (sbatch already gives a batch script /dev/null.)"""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def _stop_once() -> None:
    """A cancel signals job.sh's whole group, and job.sh's death sends this agent SIGTERM once more
    (die_with_parent): torchrun's handler would raise its SignalException again in the middle of stopping
    the ranks (a second traceback, ranks left unstopped). Only the first signal starts the stop."""
    from torch.distributed.elastic.multiprocessing import api

    handler = getattr(api, "_terminate_process_handler", None)
    if handler is None:  # another torch: keep its own behaviour
        return
    stopping = False

    def first_only(signum: int, frame: object) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            handler(signum, frame)

    api._terminate_process_handler = first_only


if __name__ == "__main__":
    sys.exit(main())
