"""`flux-cluster evaluate --submit`'s job on one rank: ``python -m flux_cluster.jobs.evaluate --config
RUN/config.yaml`` runs the evaluation library (flux_cluster/evaluate/run.py) with the options the command
wrote beside the config (OPTIONS_FILE, every path absolute), never a command line."""

import argparse
import sys
from pathlib import Path

from flux_cluster.errors import FluxClusterError
from flux_cluster.evaluate import OPTIONS_FILE
from flux_cluster.evaluate.options import EvalOptions, options_from_json
from flux_cluster.runtime.job_file import read_job_file
from flux_cluster.safe_text import printable


def read_options(path: Path) -> EvalOptions:
    written_by = "the options 'flux-cluster evaluate --submit' writes ({\"options\": {...}})"
    return options_from_json(read_job_file(path, written_by).get("options"), f"{path}: options")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flux_cluster.jobs.evaluate", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the run directory's config.yaml")
    args = parser.parse_args(argv)
    try:
        options = read_options(args.config.parent / OPTIONS_FILE)
        from flux_cluster.console import cli_console
        from flux_cluster.evaluate.run import evaluate  # torch and diffusers load here
        from flux_cluster.evaluate.show import show_result
        from flux_cluster.rundir import runs_root

        console = cli_console(stderr=True)
        # every path in the options is absolute: the runs folder is only a default nothing falls back to
        result = evaluate(
            options,
            runs_root(None),
            log=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True),
        )
    except FluxClusterError as exc:  # one line and exit code 2, as the command prints it
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(printable(f"error: {where}{exc.strerror or exc}"), file=sys.stderr)
        return 2
    show_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
