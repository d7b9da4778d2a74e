"""The DeepSpeed pieces that need no process group: the generated engine config, sharding, the launch check.

The a100x2 path itself — two gloo ranks under torchrun, ZeRO-3, real MCP servers, checkpoint and resume — is
`test_ds_trainer.py`.
"""

from __future__ import annotations

import pytest

from mcprl_train import collectives
from mcprl_train.config import Config
from mcprl_train.errors import DistributedError
from mcprl_train.parallel.deepspeed import deepspeed_config, init_distributed


def test_a100x2_generates_a_zero3_bf16_config_without_a_deepspeed_optimizer() -> None:
    ds = deepspeed_config(Config.load(profile="a100x2"))
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["bf16"] == {"enabled": True}
    assert ds["gradient_clipping"] == 1.0
    assert ds["managed_gradient_accumulation"] is False
    assert "optimizer" not in ds
    assert "scheduler" not in ds


def test_each_rank_gets_whole_groups_and_together_all_of_them() -> None:
    groups = [f"g{i}" for i in range(5)]
    shards = [collectives.shard(groups, rank, 2) for rank in range(2)]
    assert [len(s) for s in shards] == [3, 2]
    assert sorted(g for s in shards for g in s) == groups
    assert collectives.shard(groups, 0, 1) == groups
    with pytest.raises(ValueError, match="outside world"):
        collectives.shard(groups, 2, 2)


def test_init_without_a_launcher_says_how_to_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(DistributedError, match=r"torchrun --nproc-per-node N -m mcprl_train \.\.\."):
        init_distributed()
