"""GAE over policy tokens only equals a direct recursive transcription; tool tokens carry no credit."""

from __future__ import annotations

import pytest
import torch
from grpo_testkit import tolist_2d
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mcprl_grpo import ArgumentError, gae_advantages, rewards_at_last_token

FAST = settings(max_examples=40, deadline=None)


@st.composite
def episodes(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 10))
    n = b * t
    r = draw(st.lists(st.floats(-2, 2), min_size=n, max_size=n))
    v = draw(st.lists(st.floats(-2, 2), min_size=n, max_size=n))
    m = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    shape = (b, t)
    return (
        torch.tensor(r, dtype=torch.float64).reshape(shape),
        torch.tensor(v, dtype=torch.float64).reshape(shape),
        torch.tensor(m).reshape(shape),
    )


def recursive_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """Schulman et al. 2016 eq. (16), terminal after the last step: Â_t = δ_t + γλ Â_{t+1}."""
    adv = [0.0] * len(rewards)
    nxt_adv, nxt_v = 0.0, 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * nxt_v - values[t]
        nxt_adv = delta + gamma * lam * nxt_adv
        adv[t] = nxt_adv
        nxt_v = values[t]
    return adv


PARAMS = st.tuples(st.sampled_from([0.0, 0.5, 0.99, 1.0]), st.sampled_from([0.0, 0.95, 1.0]))


@FAST
@given(episodes(), PARAMS)
@example(
    (
        torch.zeros(1, 3, dtype=torch.float64),
        torch.ones(1, 3, dtype=torch.float64),
        torch.zeros(1, 3, dtype=torch.bool),
    ),
    (0.99, 0.95),
)
def test_gae_equals_recursion_over_policy_tokens(
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], params: tuple[float, float]
) -> None:
    r, v, m = data
    gamma, lam = params
    adv, ret = gae_advantages(r, v, m, gamma=gamma, lam=lam)
    want = torch.zeros_like(r)
    for b in range(r.shape[0]):
        pos = [t for t in range(r.shape[1]) if m[b, t]]
        sub = recursive_gae([float(r[b, t]) for t in pos], [float(v[b, t]) for t in pos], gamma, lam)
        for t, a in zip(pos, sub, strict=True):
            want[b, t] = a
    torch.testing.assert_close(adv, want, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(ret, torch.where(m, want + v, 0.0), atol=1e-12, rtol=1e-12)


@FAST
@given(episodes(), PARAMS)
def test_tool_tokens_neither_receive_nor_pass_credit(
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], params: tuple[float, float]
) -> None:
    r, v, m = data
    gamma, lam = params
    adv, ret = gae_advantages(r, v, m, gamma=gamma, lam=lam)
    noisy_r = torch.where(m, r, torch.tensor(float("nan"), dtype=torch.float64))
    noisy_v = torch.where(m, v, 1e6)
    adv2, ret2 = gae_advantages(noisy_r, noisy_v, m, gamma=gamma, lam=lam)
    torch.testing.assert_close(adv2, adv)
    torch.testing.assert_close(ret2, ret)
    assert torch.equal(adv[~m], torch.zeros_like(adv[~m]))
    assert torch.equal(ret[~m], torch.zeros_like(ret[~m]))


def test_undiscounted_returns_are_future_reward_sums_across_tool_output() -> None:
    mask = torch.tensor([[1, 1, 0, 0, 1, 0]])
    rewards = rewards_at_last_token(torch.tensor([2.0]), mask)
    assert tolist_2d(rewards) == [[0.0, 0.0, 0.0, 0.0, 2.0, 0.0]]
    adv, ret = gae_advantages(rewards, torch.zeros(1, 6), mask, gamma=1.0, lam=1.0)
    assert tolist_2d(ret) == [[2.0, 2.0, 0.0, 0.0, 2.0, 0.0]]
    _, disc = gae_advantages(rewards, torch.zeros(1, 6), mask, gamma=0.5, lam=1.0)
    # γ counts policy steps: two policy tokens separate position 0 from the reward, not four.
    assert tolist_2d(disc) == [[0.5, 1.0, 0.0, 0.0, 2.0, 0.0]]
    assert not adv.requires_grad


def test_rewards_at_last_token_handles_rows_without_policy_tokens() -> None:
    out = rewards_at_last_token(torch.tensor([1.0, 3.0]), torch.tensor([[0, 0], [1, 0]]))
    assert tolist_2d(out) == [[0.0, 0.0], [3.0, 0.0]]


def test_gamma_outside_unit_interval_is_rejected() -> None:
    with pytest.raises(ArgumentError, match="gamma"):
        gae_advantages(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), gamma=1.5)
