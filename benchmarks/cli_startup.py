"""Start-up time of `flux-cluster --help` against a bare `python -c pass` measured in the same run.

    .venv/bin/python benchmarks/cli_startup.py [--repeats 20]

Also checks that the help path imports neither torch nor submitit.
"""

import argparse
import statistics
import subprocess
import sys
import time


def timed(command: list[str], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    cases = {
        "python -c pass (baseline)": [sys.executable, "-c", "pass"],
        "python -c 'import torch' (for scale)": [sys.executable, "-c", "import torch"],
        "flux-cluster --help": [sys.executable, "-m", "flux_cluster", "--help"],
        "flux-cluster systems list": [sys.executable, "-m", "flux_cluster", "systems", "list"],
    }
    # Interleave the cases so machine noise hits them alike.
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, command in cases.items():
            results[name] += timed(command, 1)
    baseline = statistics.median(results["python -c pass (baseline)"])
    print(f"{'command':40} {'median ms':>10} {'vs baseline':>12}")
    for name, samples in results.items():
        median = statistics.median(samples)
        print(f"{name:40} {median * 1e3:10.0f} {median / baseline:11.1f}x")

    probe = (
        "import sys; from flux_cluster.cli import app; "
        "print(sorted(m for m in ('torch', 'submitit') if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(f"heavy modules imported by the CLI at start-up: {loaded}")


if __name__ == "__main__":
    main()
