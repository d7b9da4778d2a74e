"""Targets of the recomputed old policy: every tensor on the forward's device.

The ``meta`` device stands in for CUDA here: like CUDA, it refuses to mix its tensors with CPU ones, so a target
computed from a CPU tensor (the episode's mask or rewards) next to the model's outputs fails on CPU too.
"""

from __future__ import annotations

import pytest
import torch

from mcprl_env import Episode
from mcprl_policy import PackedForward
from mcprl_train.config import Config
from mcprl_train.loop import targets
from mcprl_train.loop.samples import episode_sample, micro_batch
from mcprl_train.loop.targets import old_policy_targets


def episode(n: int, reward: float) -> Episode:
    mask = [0] * 3 + [1] * (n - 3)
    return Episode(
        episode_id=f"e{n}", task_id="t", group_id="t", token_ids=list(range(5, 5 + n)), prompt_length=3,
        loss_mask=mask, sampler_logprobs=[-1.0 * m for m in mask], messages=[], reward=reward,
        reward_components={}, valid=True, success=reward > 0, stop_reason="answer", error=None, answer=None,
        metrics={},
    )  # fmt: skip


def meta_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`mcprl_grpo.gae_advantages` reads its mask's lengths (data a meta tensor lacks): this double checks the
    devices of what it is given and returns meta tensors of the right shape."""
    del gamma, lam
    for name, t in (("rewards", rewards), ("values", values), ("mask", mask)):
        assert t.device.type == "meta", f"{name} on {t.device}"
    return torch.empty_like(values), torch.empty_like(values)


@pytest.mark.parametrize("kl_in_reward", [False, True])
def test_targets_stay_on_the_device_of_the_forward(
    kl_in_reward: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(targets, "gae_advantages", meta_gae)
    grpo = Config.load(
        overrides=[
            "model.value_head=true",
            "grpo.estimator=gae",
            "grpo.tis=2.0",
            "grpo.kl_coef=0.1",
            f"grpo.kl_in_reward={str(kl_in_reward).lower()}",
        ]
    ).grpo
    samples = [episode_sample(episode(n, float(n % 2)), 0.0) for n in (6, 9)]
    m = micro_batch(samples, device="meta")
    for name in ("seq_ids", "mask", "adv", "old", "sampler"):
        assert getattr(m, name).device.type == "meta", name
    total = sum(m.lengths)
    out = PackedForward(
        logprobs=torch.empty(total, device="meta"),
        entropies=torch.empty(total, device="meta"),
        values=torch.empty(total, device="meta"),
        valid=torch.ones(total, dtype=torch.bool, device="meta"),
        seq_lens=tuple(m.lengths),
    )
    m.ref = torch.empty(total, device="meta")
    penalty = old_policy_targets(m, out, grpo, values=True)
    assert m.tis is not None
    assert m.returns is not None
    for tensor in (m.old, m.tis, m.adv, m.returns, penalty):
        assert tensor.device.type == "meta"
    assert m.adv.shape == (total,)
