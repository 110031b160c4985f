"""Preflight job, run on every rank: versions, accelerators, an all_reduce check with its bandwidth,
the data and log roots, and a few training steps of one block of the system's model with its own train
settings on every GPU (flux_cluster/jobs/model_check.py), with the GPU's measured bf16 GEMM peak.
``--soak-seconds`` keeps the interconnect busy and reports stability; it saves its progress on SIGUSR1
and asks the job script to requeue it (flux_cluster/runtime/signals.py).

Launched by ``flux-cluster preflight`` (and with ``--comm-only`` before training when comm_test is on).
"""

import argparse
import json
import os
import platform
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from flux_cluster.atomic import write_atomic
from flux_cluster.rundir import preflight_file, read_run_config, soak_state_file
from flux_cluster.runtime.dist import DistInfo, exit_rank, init_distributed
from flux_cluster.runtime.signals import StopRequest, finish_interrupted


def accelerator_report() -> dict[str, Any]:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if count else None,
        "count": count,
        "names": [torch.cuda.get_device_name(i) for i in range(count)],
    }


def check_all_reduce(info: DistInfo) -> bool:
    value = torch.tensor([float(info.rank + 1)], device=info.device)
    dist.all_reduce(value)
    return value.item() == info.world_size * (info.world_size + 1) / 2


def _synchronize(info: DistInfo) -> None:
    if info.device.type == "cuda":
        torch.cuda.synchronize(info.device)


def _slowest(seconds: float, info: DistInfo) -> float:
    value = torch.tensor([seconds], dtype=torch.float64, device=info.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item()


ONE_RANK_BANDWIDTH = (
    "preflight: all_reduce bandwidth not measured: one rank has nothing to exchange (its sum was checked)"
)


def bus_bandwidth(size_bytes: int, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an all_reduce in GB/s: algbw * 2(n-1)/n (algbw alone when n == 1)."""
    factor = 2 * (world_size - 1) / world_size if world_size > 1 else 1.0
    return size_bytes / seconds * factor / 1e9


def measure_all_reduce(info: DistInfo, size_bytes: int, iterations: int, warmup: int = 2) -> dict[str, float]:
    buffer = torch.ones(size_bytes // 4, dtype=torch.float32, device=info.device)
    for _ in range(warmup):
        dist.all_reduce(buffer)
    _synchronize(info)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(buffer)
    _synchronize(info)
    seconds = _slowest((time.perf_counter() - start) / iterations, info)
    return {
        "bytes": size_bytes,
        "seconds": seconds,
        "busbw_gbps": bus_bandwidth(size_bytes, seconds, info.world_size),
    }


def check_directory(path: str | None, writable: bool) -> dict[str, Any]:
    if path is None:
        return {"path": None, "ok": True, "detail": "not configured"}
    folder = Path(path)
    if not folder.is_dir():
        return {"path": path, "ok": False, "detail": "missing or not a directory"}
    if not os.access(folder, os.R_OK | os.X_OK):
        return {"path": path, "ok": False, "detail": "not readable"}
    entries = sum(1 for _ in folder.iterdir())
    free_gb = shutil.disk_usage(folder).free / 1e9
    if writable:
        probe = folder / f".preflight-{socket.gethostname()}-{os.getpid()}"
        try:
            write_atomic(probe, "ok\n")
            probe.unlink()
        except OSError as exc:
            return {"path": path, "ok": False, "detail": f"not writable: {exc.strerror}"}
    return {"path": path, "ok": True, "detail": f"{entries} entries, {free_gb:.1f} GB free"}


def soak(
    info: DistInfo, size_bytes: int, seconds: float, state_file: Path, stop: StopRequest
) -> tuple[dict[str, Any], bool]:
    """All-reduce for `seconds` in total across restarts. Returns (stats, interrupted)."""
    done = json.loads(state_file.read_text())["elapsed"] if state_file.is_file() else 0.0
    if done and info.rank == 0:
        print(f"preflight: resuming the soak after a requeue at {done:.1f} of {seconds:.0f} s", flush=True)
    samples: list[float] = []
    decision = torch.zeros(2, device=info.device)  # [signal received, time is up] on any rank
    start = time.monotonic() - done
    while True:
        samples.append(measure_all_reduce(info, size_bytes, iterations=1, warmup=0)["busbw_gbps"])
        decision[0] = 1.0 if stop.requested else 0.0
        decision[1] = 1.0 if time.monotonic() - start >= seconds else 0.0
        dist.all_reduce(decision, op=dist.ReduceOp.MAX)  # every rank leaves at the same iteration
        if decision[0].item():
            if info.rank == 0:
                write_atomic(state_file, json.dumps({"elapsed": time.monotonic() - start}))
            return {"iterations": len(samples)}, True
        if decision[1].item():
            break
    samples.sort()
    stats = {
        "seconds": seconds,
        "iterations": len(samples),
        "busbw_min_gbps": samples[0] if samples else None,
        "busbw_median_gbps": samples[len(samples) // 2] if samples else None,
        "busbw_max_gbps": samples[-1] if samples else None,
    }
    return stats, False


def print_summary(
    reports: list[dict[str, Any]], bandwidth: list[dict[str, float]], failures: list[str]
) -> None:
    from rich.console import Console
    from rich.table import Table

    from flux_cluster.console import print_table

    console = Console(width=140, force_terminal=False)
    ranks = Table(title="preflight: ranks")
    for column in ("rank", "host", "python", "torch", "backend", "accelerators", "data root", "run dir"):
        ranks.add_column(column)
    for r in reports:
        accel = r["accelerators"]
        devices = f"{accel['count']} x {accel['names'][0]}" if accel["count"] else "none (CPU)"
        ranks.add_row(
            str(r["rank"]),
            r["host"],
            r["python"],
            r["torch"],
            r["backend"],
            devices,
            r["data_root"]["detail"] if r["data_root"] else "-",
            r["run_dir"]["detail"] if r["run_dir"] else "-",
        )
    print_table(console, ranks)
    if bandwidth:
        bw = Table(title=f"preflight: all_reduce across {reports[0]['world_size']} ranks")
        for column in ("size", "time", "bus bandwidth"):
            bw.add_column(column, justify="right")
        for row in bandwidth:
            bw.add_row(
                f"{row['bytes'] / 2**20:.0f} MiB",
                f"{row['seconds'] * 1e3:.2f} ms",
                f"{row['busbw_gbps']:.3f} GB/s",
            )
        print_table(console, bw)
    checks = [r for r in reports if r.get("model_check")]
    if checks:
        model = Table(title=f"preflight: model step per GPU ({checks[0]['model_check']['settings']})")
        for column in (
            "rank",
            "host",
            "device",
            "attention",
            "step ms",
            "step TFLOP/s",
            "GEMM peak",
            "of peak",
        ):
            model.add_column(column, justify="right")
        for r in checks:
            check, accel = r["model_check"], r["accelerators"]
            device = accel["names"][r["local_rank"]] if accel["count"] > r["local_rank"] else "cpu"
            if check["ok"]:
                figures = (
                    f"{check['step_ms']:.1f}",
                    f"{check['step_tflops']:.3g}",
                    f"{check['gemm_peak_tflops']:.3g}",
                    f"{check['step_tflops'] / check['gemm_peak_tflops']:.0%}",
                )
            else:
                figures = ("FAILED", "-", "-", "-")
            model.add_row(str(r["rank"]), r["host"], device, check.get("attention_kernel", "-"), *figures)
        print_table(console, model)
    if bandwidth:
        best = max(row["busbw_gbps"] for row in bandwidth)
        sizes = len(bandwidth)
        print(f"preflight: all_reduce bus bandwidth {best:.3f} GB/s (best of {sizes} sizes)", flush=True)
    else:
        print(ONE_RANK_BANDWIDTH, flush=True)
    verdict = "PASSED" if not failures else "FAILED: " + "; ".join(failures)
    print(f"preflight: {verdict}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flux_cluster.jobs.preflight", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the run's resolved config.yaml")
    parser.add_argument("--comm-only", action="store_true", help="only the all_reduce bandwidth test")
    parser.add_argument("--soak-seconds", type=float, default=0.0, help="all_reduce burn-in duration")
    parser.add_argument(
        "--max-mb", type=int, default=None, help="largest all_reduce size (default 1024 GPU, 16 CPU)"
    )
    args = parser.parse_args(argv)

    system, _job = read_run_config(args.config)
    stop = StopRequest().install()
    info = init_distributed(system.dist_backend)
    run_dir = Path(os.environ.get("FLUX_RUN_DIR", args.config.parent))
    exp = os.environ.get("FLUX_EXP_INDEX", "0")

    max_mb = args.max_mb or (1024 if info.device.type == "cuda" else 16)
    sizes = [mb * 2**20 for mb in (1, 4, 16, 64, 256, 1024) if mb <= max_mb]
    # One rank exchanges nothing: its all_reduce is a no-op whose "bandwidth" would be meaningless.
    many = info.world_size > 1
    bandwidth = [measure_all_reduce(info, size, iterations=5) for size in sizes] if many else []
    correct = check_all_reduce(info)

    first_on_node = info.local_rank == 0
    report = {
        "rank": info.rank,
        "world_size": info.world_size,
        "local_rank": info.local_rank,
        "host": socket.gethostname(),
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "backend": info.backend,
        "accelerators": accelerator_report(),
        "data_root": None,
        "run_dir": None,
    }
    if not args.comm_only and first_on_node:
        report["data_root"] = check_directory(os.environ.get("FLUX_DATA_DIR", system.paths.data_root), False)
        report["run_dir"] = check_directory(str(run_dir), True)

    if not args.comm_only:
        report["model_check"] = _model_check(system, info)

    soak_stats: dict[str, Any] | None = None
    if args.soak_seconds > 0:
        state_file = soak_state_file(run_dir, exp)
        soak_stats, interrupted = soak(info, sizes[-1], args.soak_seconds, state_file, stop)
        if interrupted:
            if info.rank == 0:
                print("preflight: SIGUSR1 received, soak progress saved; exiting for requeue", flush=True)
            dist.barrier()  # progress is saved before anyone asks for the requeue
            dist.destroy_process_group()
            return finish_interrupted(info.rank)

    reports: list[Any] = [None] * info.world_size
    dist.all_gather_object(reports, report)
    failures = _failures(reports, correct, system.vendor)
    if info.rank == 0:
        print_summary(reports, bandwidth, failures)
        if not args.comm_only:
            result = {
                "passed": not failures,
                "failures": failures,
                "ranks": reports,
                "all_reduce": bandwidth,
                "soak": soak_stats,
                "restarts": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
            }
            write_atomic(preflight_file(run_dir, exp), json.dumps(result, indent=2) + "\n")
    dist.destroy_process_group()
    return 0 if not failures else 1


def _model_check(system: Any, info: DistInfo) -> dict[str, Any]:
    from flux_cluster.config.workload import resolve_training
    from flux_cluster.errors import FluxClusterError
    from flux_cluster.jobs.model_check import own_mesh, run_model_check

    mesh = own_mesh(info.device)  # collective: before anything that can fail on one rank only
    try:
        plan = resolve_training(system)
    except FluxClusterError as exc:
        return {"ok": False, "settings": "the system's train section", "detail": str(exc)}
    return run_model_check(plan, info.device, mesh, gpu_memory_gb=system.gpu_memory_gb)


def _failures(reports: list[dict[str, Any]], all_reduce_correct: bool, vendor: str) -> list[str]:
    failures = [] if all_reduce_correct else ["all_reduce returned a wrong sum"]
    for r in reports:
        check = r.get("model_check")
        if check and not check["ok"]:
            failures.append(
                f"{r['host']} rank {r['rank']}: the model step failed "
                f"({check['settings']}): {check['detail']}"
            )
        for key in ("data_root", "run_dir"):
            if r[key] and not r[key]["ok"]:
                failures.append(f"{r['host']}: {key.replace('_', ' ')} {r[key]['path']}: {r[key]['detail']}")
        if vendor != "cpu" and r["accelerators"]["count"] == 0:
            failures.append(f"{r['host']} rank {r['rank']}: no accelerator visible")
    return failures


if __name__ == "__main__":
    exit_rank(main())
