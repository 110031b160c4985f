"""The official MLPerf compliance checker, as the tests run it on result logs."""

import subprocess
import sys
from pathlib import Path


def compliance_check(log: Path, ruleset: str) -> subprocess.CompletedProcess[str]:
    """Run in the log's folder: the checker writes compliance_checker.log into its working directory."""
    checker = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training"]
    return subprocess.run(
        [*checker, "--ruleset", ruleset, str(log.absolute())],
        capture_output=True,
        text=True,
        cwd=log.parent,
        check=False,
    )
