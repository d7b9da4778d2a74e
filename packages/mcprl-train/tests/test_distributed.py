from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mcprl_train.config import Config
from mcprl_train.distributed import deepspeed_config, fixed_token_groups, init_distributed, shard_groups
from mcprl_train.errors import DistributedError


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


def test_fixed_token_groups_are_the_same_on_every_call() -> None:
    assert fixed_token_groups(2, 4, vocab=50, seed=3) == fixed_token_groups(2, 4, vocab=50, seed=3)


def test_init_without_a_launcher_says_how_to_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(DistributedError, match=r"torchrun --nproc-per-node N -m mcprl_train\.distributed"):
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
        "mcprl_train.distributed",
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
