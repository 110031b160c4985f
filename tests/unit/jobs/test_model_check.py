"""Preflight's model check on a cut-down model (one block of each kind) runs the wrappers the job's mode
would use: an ops+N mode checks both the selective and the whole-block wrapper."""

import torch

from flux_cluster.config import load_system
from flux_cluster.config.workload import resolve_training
from flux_cluster.jobs.model_check import checked_mode, run_model_check
from flux_cluster.runtime.dist import DistInfo
from flux_cluster.training.parallelize import block_wrappings, make_mesh


def test_an_ops_plus_n_mode_is_checked_with_one_block_of_each_wrapper() -> None:
    assert checked_mode("ops+13") == "ops+1" and block_wrappings("ops+1", 1, 1) == ["ops", "full"]
    assert block_wrappings("ops+13", 1, 1) == ["full", "full"]  # what checking it as is would run
    for mode in ("full", "ops", "none", "alternate", "single"):
        assert checked_mode(mode) == mode


def test_the_model_check_trains_an_ops_plus_n_plan_and_says_how_it_checked_it(one_rank: DistInfo) -> None:
    system = load_system("local", ["train.activation_checkpointing=ops+13", "train.micro_batch_size=2"])
    plan = resolve_training(system.config)
    result = run_model_check(plan, torch.device("cpu"), make_mesh(torch.device("cpu"), 1, 1), steps=1)
    assert result["ok"], result["detail"]
    assert "activation checkpointing ops+13 (checked as ops+1: one block of each kind)" in result["settings"]
