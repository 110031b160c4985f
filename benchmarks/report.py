"""`flux-cluster report` against MLPerf's official result_summarizer, measured in the same run.

    .venv/bin/python benchmarks/report.py [--repeats 3] [--synthetic-gb 1.0] [--keep DIR]

Two inputs:
- the real MLPerf v5.1 flux1 sample (tests/data/mlperf_v51_sample.tar.xz: ten runs, 4.7 MB);
- the same group with result_0.txt grown to --synthetic-gb by repeating its per-step
  ``tracked_stats`` lines inside the run (run_start, run_stop and the evals unchanged, so the scores
  must not move).

For each: wall time and peak RSS of the summarizer (it always runs the compliance checker) and of
`flux-cluster report --format json` with --no-check and (on the sample) --check, as separate
processes, the best of --repeats (one run each on the big log: the summarizer takes many minutes).
Scores are compared to the summarizer's (its CSV keeps full precision).
"""

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARCHIVE = REPO / "tests" / "data" / "mlperf_v51_sample.tar.xz"
GROUP = Path("NVIDIA/results/tyche_ngpu16_ngc25.09_nemo/flux1")
WIDTHS = (8, 8, 11, 20, 10)


def measured(command: list[str], cwd: Path) -> tuple[float, float, str]:
    """(seconds, peak RSS in MB, stdout) of one child process."""
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            raise SystemExit(f"{' '.join(command)} exited {process.returncode}")
        out.seek(0)
        return seconds, usage.ru_maxrss / 1024, out.read().decode()


def official(tree: Path) -> tuple[float, float, float]:
    """(seconds, MB, minutes) of result_summarizer on tree."""
    csv_path = tree / "summary.csv"
    command = [sys.executable, "-m", "mlperf_logging.result_summarizer", "NVIDIA", "training", "5.1.0"]
    seconds, rss, _ = measured([*command, "--csv", str(csv_path)], tree)
    (row,) = csv.DictReader(csv_path.open())
    return seconds, rss, float(row["flux1"])


def ours(tree: Path, check: bool) -> tuple[float, float, float]:
    command = [sys.executable, "-m", "flux_cluster", "report", str(tree), "--format", "json"]
    seconds, rss, stdout = measured([*command, "--check" if check else "--no-check"], tree)
    (group,) = json.loads(stdout)["groups"]
    return seconds, rss, group["olympic_minutes"]


def grow(log: Path, target_bytes: int) -> None:
    lines = log.read_bytes().splitlines(keepends=True)
    stats = b"".join(line for line in lines if b'"tracked_stats"' in line)
    body = next(i for i, line in enumerate(lines) if b'"run_start"' in line) + 1
    with log.open("wb") as out:
        out.writelines(lines[:body])
        written = sum(map(len, lines))
        while written < target_bytes:
            out.write(stats)
            written += len(stats)
        out.writelines(lines[body:])


def bench(name: str, tree: Path, repeats: int, with_check: bool = True) -> None:
    size = sum(p.stat().st_size for p in (tree / GROUP).glob("result_*.txt"))
    rows = {"result_summarizer (official, checks)": lambda: official(tree)}
    rows["flux-cluster report --no-check"] = lambda: ours(tree, check=False)
    if with_check:
        rows["flux-cluster report --check"] = lambda: ours(tree, check=True)
    best: dict[str, tuple[float, float, float]] = {}
    for _ in range(repeats):  # interleaved, so machine noise hits all alike
        for label, run in rows.items():
            seconds, rss, minutes = run()
            old = best.get(label)
            best[label] = (
                min(seconds, old[0]) if old else seconds,
                max(rss, old[1]) if old else rss,
                minutes,
            )
    base_s, _, base_minutes = best["result_summarizer (official, checks)"]
    print(f"\n{name}: {len(list((tree / GROUP).glob('result_*.txt')))} logs, {size / 1e6:,.1f} MB")
    header = ("tool", "best s", "speed-up", "peak RSS MB", "olympic minutes", "same score")
    print(
        f"| {header[0]:38} | "
        + " | ".join(f"{h:>{w}}" for h, w in zip(header[1:], WIDTHS, strict=True))
        + " |"
    )
    print("|" + "|".join("-" * (w + 2) for w in (38, *WIDTHS)) + "|")
    for label, (seconds, rss, minutes) in best.items():
        same = "yes" if minutes is not None and abs(minutes - base_minutes) < 1e-6 else "NO"
        cells = (f"{seconds:.2f}", f"{base_s / seconds:.1f}x", f"{rss:.0f}", str(minutes), same)
        print(f"| {label:38} | " + " | ".join(f"{c:>{w}}" for c, w in zip(cells, WIDTHS, strict=True)) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--synthetic-gb", type=float, default=1.0, help="0 skips the big-log case")
    parser.add_argument("--keep", type=Path, help="work here and keep the files (default: a temp dir)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="report-bench-"))
    try:
        with tarfile.open(ARCHIVE) as archive:
            archive.extractall(work, filter="data")
        sample = work / "mlperf_v51_sample"
        for path in sample.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        bench("MLPerf v5.1 sample", sample, args.repeats)
        if args.synthetic_gb > 0:
            big = work / "synthetic"
            shutil.copytree(sample, big)
            grow(big / GROUP / "result_0.txt", int(args.synthetic_gb * 1e9))
            # --check runs the same official checker the summarizer runs (in a worker): on a big log it
            # costs what the summarizer costs, so only the streaming path is timed here.
            bench(f"sample with result_0.txt grown to {args.synthetic_gb:g} GB", big, 1, with_check=False)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
