"""How a distributed job's rank ends: exit handlers run, output is flushed, no interpreter teardown."""

import os
import socket
import subprocess
import sys
from pathlib import Path

RANK = """
import atexit, sys
from pathlib import Path
import torch
from torch.distributed.fsdp import fully_shard
from flux_cluster.runtime.dist import exit_rank, init_distributed
from flux_cluster.jobs.model_check import own_mesh

info = init_distributed("gloo")
out = Path(sys.argv[1])
atexit.register(lambda: (out / f"atexit_{info.rank}").write_text("ran"))
model = fully_shard(torch.nn.Linear(8, 8), mesh=own_mesh(info.device))  # DTensors on a subgroup mesh
model(torch.ones(2, 8)).sum().backward()
torch.distributed.destroy_process_group()
print(f"rank {info.rank} done", end="")  # unflushed, no newline
exit_rank(5)
raise AssertionError("exit_rank returned")
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_exit_rank_runs_exit_handlers_flushes_and_returns_the_code(tmp_path: Path) -> None:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(tmp_path)],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for rank, process in enumerate(ranks):
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 5, stderr
        assert stdout == f"rank {rank} done"
        assert "terminate called" not in stderr and "AssertionError" not in stderr
        assert (tmp_path / f"atexit_{rank}").read_text() == "ran"
