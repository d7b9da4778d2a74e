"""KL estimators k1/k2/k3 (Schulman 2020): signs, zeros, exact expectations, penalty and loss helpers."""

from __future__ import annotations

import math

import pytest
import torch
from grpo_testkit import tolist_1d
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mcprl_grpo import KLEstimator, kl_loss, kl_penalty_rewards, token_kl

FAST = settings(max_examples=50, deadline=None)
LOGP = st.floats(-30.0, 0.0)


def paper_k(lp: float, ref: float, k: str) -> float:
    """Schulman 2020 with r = π_ref/π_θ: k1 = -log r, k2 = ½(log r)², k3 = (r - 1) - log r."""
    log_r = ref - lp
    return {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": math.exp(log_r) - 1 - log_r}[k]


@FAST
@given(
    st.lists(st.tuples(LOGP, LOGP, st.booleans()), min_size=1, max_size=12),
    st.sampled_from(["k1", "k2", "k3"]),
)
@example([(-1.0, -1.0, True)], "k3")
def test_estimators_equal_their_formulas_with_signs_where_they_must(
    rows: list[tuple[float, float, bool]], k: KLEstimator
) -> None:
    lp = torch.tensor([r[0] for r in rows], dtype=torch.float64)
    ref = torch.tensor([r[1] for r in rows], dtype=torch.float64)
    mask = torch.tensor([r[2] for r in rows])
    got = token_kl(lp, ref, mask, estimator=k)
    want = torch.tensor([paper_k(a, b, k) if m else 0.0 for a, b, m in rows], dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)
    if k != "k1":
        assert bool((got >= 0).all())


@FAST
@given(st.lists(LOGP, min_size=1, max_size=12), st.sampled_from(["k1", "k2", "k3"]))
def test_every_estimator_is_zero_when_policies_agree(lp: list[float], k: KLEstimator) -> None:
    t = torch.tensor(lp, dtype=torch.float64)
    assert torch.equal(
        token_kl(t, t.clone(), torch.ones_like(t, dtype=torch.bool), estimator=k), torch.zeros_like(t)
    )


@FAST
@given(st.integers(2, 50), st.integers(0, 2**31 - 1))
def test_k1_and_k3_expectations_under_the_policy_equal_exact_kl(vocab: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 2, -1)
    logq = torch.log_softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 2, -1)
    exact = (logp.exp() * (logp - logq)).sum()
    mask = torch.ones(vocab, dtype=torch.bool)
    for k in ("k1", "k3"):
        expectation = (logp.exp() * token_kl(logp, logq, mask, estimator=k)).sum()
        torch.testing.assert_close(expectation, exact, atol=1e-10, rtol=1e-9)


def test_penalty_rewards_subtract_detached_scaled_kl() -> None:
    lp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0, -0.5]], dtype=torch.float64)
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    out = kl_penalty_rewards(rewards, lp, ref, mask, coef=0.1, estimator="k1")
    torch.testing.assert_close(out, torch.tensor([[-0.05, 0.0, 0.0]], dtype=torch.float64))
    assert not out.requires_grad


def test_kl_loss_gradient_flows_through_policy_only_and_not_masked_tokens() -> None:
    lp = torch.tensor([-1.0, -2.0, 5.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.2, -1.0, float("nan")], dtype=torch.float64, requires_grad=True)
    loss = kl_loss(lp, ref, torch.tensor([True, True, False]), estimator="k3")
    torch.autograd.backward(loss)
    assert lp.grad is not None
    # d/dlp of (e^{ref-lp} - 1 - (ref-lp)) = 1 - e^{ref-lp}; token-mean over 2 tokens.
    want = [(1 - math.exp(-0.2)) / 2, (1 - math.exp(1.0)) / 2, 0.0]
    assert tolist_1d(lp.grad) == pytest.approx(want)
    assert ref.grad is None
    assert math.isfinite(loss.item())
