from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mcprl_train.config import Config
from mcprl_train.errors import DistributedError
from mcprl_train.parallel.deepspeed import (
    deepspeed_config,
    equalize,
    fixed_token_groups,
    init_distributed,
    shard_groups,
    token_group,
)


def test_a100x2_generates_a_zero3_bf16_config_without_a_deepspeed_optimizer() -> None:
    ds = deepspeed_config(Config.load(profile="a100x2"))
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["bf16"] == {"enabled": True}
    assert ds["gradient_clipping"] == 1.0
    assert ds["managed_gradient_accumulation"] is False
    assert "optimizer" not in ds
    assert "scheduler" not in ds


def test_each_rank_gets_whole_groups_and_together_all_of_them() -> None:
    groups = fixed_token_groups(5, 3, vocab=100)
    shards = [shard_groups(groups, rank, 2) for rank in range(2)]
    assert [len(s) for s in shards] == [3, 2]
    assert sorted(g.group_id for s in shards for g in s) == sorted(g.group_id for g in groups)
    assert all(len(g.rewards) == 3 for s in shards for g in s)


def test_invalid_episodes_become_groups_members_that_train_on_nothing() -> None:
    def episode(valid: bool, reward: float) -> SimpleNamespace:
        return SimpleNamespace(
            token_ids=[5, 6, 7],
            loss_mask=[0, 1, 1],
            sampler_logprobs=[0.0, -1.0, -2.0],
            valid=valid,
            reward=reward,
        )

    group = SimpleNamespace(group_id="step-1/t", episodes=[episode(True, 1.0), episode(False, 0.7)])
    tokens = token_group(group)
    assert tokens.loss_mask == ((0, 1, 1), (0, 0, 0))
    assert tokens.rewards == (1.0, 0.0)


def test_equalize_pads_with_constant_reward_copies() -> None:
    groups = fixed_token_groups(1, 3, vocab=50)
    padded = equalize(groups, 2, 3)
    assert len(padded) == 3
    assert padded[0] == groups[0]
    assert all(set(g.rewards) == {0.0} and g.token_ids == groups[0].token_ids for g in padded[1:])


def test_fixed_token_groups_are_the_same_on_every_call() -> None:
    assert fixed_token_groups(2, 4, vocab=50, seed=3) == fixed_token_groups(2, 4, vocab=50, seed=3)


def test_init_without_a_launcher_says_how_to_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(DistributedError, match=r"torchrun --nproc-per-node N -m mcprl_train \.\.\."):
        init_distributed()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a100x2_code_path_on_two_cpu_processes_leaves_identical_updated_parameters(tmp_path: Path) -> None:
    """ZeRO-3 over 2 gloo ranks with the tiny model: 2 GRPO steps, then every rank gathers the full weights."""
    overrides = [
        "model.name=tiny",
        "model.device=cpu",
        "model.dtype=float32",
        "model.gradient_checkpointing=false",
        "distributed.bf16=false",  # gloo has no bf16 reduce; everything else is the a100x2 path
        "grpo.tasks_per_step=4",
        "grpo.group_size=4",
        "optim.lr=1e-3",
    ]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        "-m",
        "mcprl_train.parallel.deepspeed",
        "--profile",
        "a100x2",
        "--steps",
        "2",
        "--out",
        str(tmp_path),
    ]
    for item in overrides:
        command += ["--set", item]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["digest"] == ranks[1]["digest"]
    assert ranks[0]["changed"] is True
    assert all(math.isfinite(r["loss/policy"]) and r["optim/grad_norm"] > 0 for r in ranks)


@pytest.mark.slow
def test_each_rank_collects_its_own_share_of_rollouts_on_the_mcp_servers(tmp_path: Path) -> None:
    """2 gloo ranks, real offline MCP servers: each rank runs a different task group, weights stay in sync."""
    overrides = [
        "model.name=tiny",
        "model.device=cpu",
        "model.dtype=float32",
        "model.gradient_checkpointing=false",
        "distributed.bf16=false",
        "grpo.tasks_per_step=2",
        "grpo.group_size=2",
        "tools.offline=[calculator,finance]",
        "env.max_new_tokens_per_turn=32",
        "collection.max_concurrent_episodes=4",
    ]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        "-m",
        "mcprl_train.parallel.deepspeed",
        "--profile",
        "a100x2",
        "--rollouts",
        "--steps",
        "1",
        "--out",
        str(tmp_path),
    ]
    for item in overrides:
        command += ["--set", item]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    shares = [set(r["last_groups"]) for r in ranks]
    assert all(len(s) == 1 for s in shares)
    assert shares[0].isdisjoint(shares[1])
    assert all(g.startswith("step-1/") for s in shares for g in s)
    assert ranks[0]["digest"] == ranks[1]["digest"]
    assert all(math.isfinite(r["loss/policy"]) for r in ranks)
