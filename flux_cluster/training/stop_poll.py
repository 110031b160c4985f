"""Stops and timed checkpoints agreed by every rank, one step late, without syncing the GPU."""

import time
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from flux_cluster.runtime.signals import StopRequest


class Agreed(NamedTuple):
    requested: bool
    """A stop was asked on some rank (a signal)."""
    requeue: bool
    """SIGUSR1 asked for it: the job script requeues the job."""
    period: int
    """Whole train.checkpoint_every_minutes periods since training started, by rank 0's clock."""


class StopPoll:
    """Whether any rank was signalled, and whether a timed checkpoint is due, agreed by all ranks without
    syncing the GPU: the flags go through a host-side gloo group, and each poll reads the all-reduce the
    previous poll started (one step late), so the CPU keeps queueing GPU work ahead instead of waiting
    for it every step. Only rank 0's clock counts (every_s 0 elsewhere): ranks' clocks differ, and a
    checkpoint is collective."""

    def __init__(self, stop: StopRequest, every_s: float) -> None:
        self.stop = stop
        self.every_s = every_s
        self.start = time.monotonic()
        self.group = dist.new_group(backend="gloo")
        self.flags = torch.zeros(3, dtype=torch.int64)
        self.pending: Any = None

    def poll(self) -> Agreed:
        """What any rank asked for, as of the previous poll."""
        agreed = Agreed(False, False, 0)
        if self.pending is not None:
            self.pending.wait()
            agreed = Agreed(bool(self.flags[0]), bool(self.flags[1]), int(self.flags[2]))
        period = int((time.monotonic() - self.start) // self.every_s) if self.every_s else 0
        self.flags = torch.tensor([int(self.stop.requested), int(self.stop.requeue), period])
        self.pending = dist.all_reduce(self.flags, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return agreed

    def close(self) -> None:
        if self.pending is not None:
            self.pending.wait()
        dist.destroy_process_group(self.group)
