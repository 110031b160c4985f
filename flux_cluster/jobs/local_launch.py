"""torchrun for ``--system local``: the same launcher, but a rank that exits non-zero ends in one line
that names the outcome and keeps the rank's exit code (3: the target was not reached), instead of
torchrun's ChildFailedError traceback and exit code 1. The ranks print their own errors.

    python -m flux_cluster.jobs.local_launch [torchrun options] -m MODULE ARGS...
"""

import logging
import sys

from flux_cluster.jobs import NOT_CONVERGED_EXIT_CODE


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
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    # torchrun's agent logs each failed rank at ERROR before raising; our line below says it once.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        torchrun(argv if argv is not None else sys.argv[1:])
    except ChildFailedError as exc:
        first_rank, _ = exc.get_first_failure()
        codes = {rank: failure.exitcode for rank, failure in exc.failures.items()}
        line, code = outcome_line(codes, first_rank)
        if line is not None:
            print(line, file=sys.stderr, flush=True)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
