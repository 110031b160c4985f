"""A training job's compliance step after each repeat whose result log MLPerf scores (the launcher names it
in flux_cluster/launch/plan.py): the official checker on the log, then one line: passed, NON-CONFORMING with
the reasons the log records (whose expected rejections pass), or error.

    python -m flux_cluster.jobs.compliance --ruleset 6.1.0 --log-output results/compliance_0.log RESULT_LOG
"""

import argparse
import re
import sys
from pathlib import Path

from flux_cluster.mlperf_rules import RULESETS, logged_conformance, read_loglines

_AT_LEAST_ONE_FAILED = re.compile(r"^Failed checks for (\w+) :")


def compliance_verdict(result_log: Path, ruleset: str, log_output: Path) -> tuple[str, int]:
    """Run the official checker on a result log: (the job's one compliance line, exit code).

    A conforming run passes or fails as the checker says. A non-conforming run (its log's conformance
    event) is expected to fail the checks its deviations name (e.g. evaluation_frequency): that alone
    is exit 0 with the label; any other failed check is exit 1."""
    import logging

    from mlperf_logging.compliance_checker import mlp_compliance

    root = logging.getLogger()
    handler = logging.FileHandler(log_output, mode="w")
    handler.setFormatter(logging.Formatter("%(levelname)s - %(message)s"))
    previous_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        checker = mlp_compliance.make_checker("training", ruleset, False, False)
        # the checker's own steps (check_file), on the log streamed as the report reads it: only its
        # :::MLLOG lines, never the parser's quadratic regex over a crash's NUL-filled line
        logging.info("Running compliance on file: %s", result_log)
        loglines, errors, dropped = read_loglines(result_log, ruleset)
        if errors:
            logging.warning(" Found %d parsing error(s)", errors)
            checker.put_message("Log lines had parsing errors.")
        if dropped:
            logging.warning(" %d :::MLLOG line(s) too long to read: not checked", dropped)
        checker.check_loglines(loglines, f"training_{ruleset}/common.yaml")
        checker.log_messages()
        passed = not checker.has_messages()
        logging.log(logging.INFO if passed else logging.ERROR, "SUCCESS" if passed else "FAILED")
    finally:
        root.removeHandler(handler)
        root.setLevel(previous_level)
        handler.close()
    name, details = result_log.name, f"(details: {log_output})"
    conformance = logged_conformance(result_log)
    if not conformance or not conformance["reasons"]:
        if passed:
            return f"{name} passed the MLPerf {ruleset} compliance check", 0
        return f"error: {name} failed the MLPerf {ruleset} compliance check {details}", 1
    label = f"{name} is NON-CONFORMING, not an MLPerf result: {'; '.join(conformance['reasons'])}"
    if passed:
        return f"{label} (the MLPerf {ruleset} compliance checker sees nothing else)", 0
    failed = set(checker.overwritable)
    for message in checker.not_overwritable:
        match = _AT_LEAST_ONE_FAILED.match(message)
        failed.add(match.group(1) if match else message)
    if failed <= set(conformance["checker_keys"]):
        keys = ", ".join(sorted(failed))
        return f"{label} (the MLPerf {ruleset} compliance checker rejects {keys} for that, nothing else)", 0
    return f"error: {name} (non-conforming) failed the MLPerf {ruleset} compliance check {details}", 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flux_cluster.jobs.compliance", description=__doc__)
    parser.add_argument("result_log", type=Path)
    parser.add_argument("--ruleset", choices=RULESETS, required=True)
    parser.add_argument("--log-output", type=Path, required=True, help="the checker's full output")
    args = parser.parse_args(argv)
    if not args.result_log.is_file():
        print(f"error: {args.result_log}: no such result log", file=sys.stderr)
        return 1
    line, code = compliance_verdict(args.result_log, args.ruleset, args.log_output)
    print(line, file=sys.stderr if code else sys.stdout, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
