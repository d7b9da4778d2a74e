"""Clipped surrogate (clip-higher, dual-clip, GSPO), value loss and entropy bonus (float64)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from grpo_testkit import tolist_2d
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mcprl_grpo import (
    AggregationMode,
    ArgumentError,
    RatioLevel,
    ShapeError,
    aggregate_loss,
    clipped_surrogate_loss,
    entropy_loss,
    value_loss,
)

FAST = settings(max_examples=40, deadline=None)
MODES: tuple[AggregationMode, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


@dataclass
class Tokens:
    logprobs: torch.Tensor
    old: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor


@st.composite
def token_batches(draw: st.DrawFn, *, max_b: int = 4, max_t: int = 7) -> Tokens:
    b, t = draw(st.integers(1, max_b)), draw(st.integers(1, max_t))
    n = b * t

    def mat(elems: st.SearchStrategy[float]) -> torch.Tensor:
        return torch.tensor(draw(st.lists(elems, min_size=n, max_size=n)), dtype=torch.float64).reshape(b, t)

    lp = mat(st.floats(-6.0, 0.0))
    old = lp + mat(st.floats(-0.8, 0.8))
    adv = mat(st.floats(-3.0, 3.0))
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n))).reshape(b, t)
    return Tokens(lp, old, adv, mask)


# (eps_low, eps_high, dual_clip)
Clip = tuple[float, float | None, float | None]
CLIPS = st.tuples(
    st.sampled_from([0.1, 0.2]), st.sampled_from([None, 0.28]), st.sampled_from([None, 1.5, 3.0])
)


def paper_token_loss(lp: float, old: float, adv: float, lo: float, hi: float, c: float | None) -> float:
    """PPO eq. (7) with DAPO's clip-higher and the dual clip of Ye et al. 2020 eq. (5), for one token."""
    r = math.exp(lp - old)
    objective = min(r * adv, min(max(r, 1 - lo), 1 + hi) * adv)
    if c is not None and adv < 0:
        objective = max(objective, c * adv)
    return -objective


@FAST
@given(token_batches(), CLIPS)
def test_clipped_surrogate_equals_ppo_dapo_dual_clip_equation(x: Tokens, clip: Clip) -> None:
    lo, hi, c = clip
    got = clipped_surrogate_loss(x.logprobs, x.old, x.adv, x.mask, eps_low=lo, eps_high=hi, dual_clip=c)
    want = [
        [
            paper_token_loss(lp, o, a, lo, lo if hi is None else hi, c) if m else 0.0
            for lp, o, a, m in zip(*row, strict=True)
        ]
        for row in zip(
            tolist_2d(x.logprobs), tolist_2d(x.old), tolist_2d(x.adv), tolist_2d(x.mask), strict=True
        )
    ]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-12, rtol=1e-12)


def _loss_and_grad(
    x: Tokens, mode: AggregationMode, level: RatioLevel, clip: Clip
) -> tuple[torch.Tensor, torch.Tensor]:
    lo, hi, c = clip
    lp = x.logprobs.clone().requires_grad_(True)
    per_token = clipped_surrogate_loss(
        lp,
        x.old,
        x.adv,
        x.mask,
        eps_low=lo,
        eps_high=hi,
        dual_clip=c,
        ratio_level=level,
    )
    loss = aggregate_loss(per_token, x.mask, mode=mode)
    torch.autograd.backward(loss)
    assert lp.grad is not None
    return loss.detach(), lp.grad


@FAST
@given(token_batches(), st.sampled_from(MODES), st.sampled_from(["token", "sequence"]), CLIPS)
@example(
    Tokens(torch.zeros(1, 2, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64),
           torch.ones(1, 2, dtype=torch.float64), torch.tensor([[False, False]])),
    "token-mean", "token", (0.2, None, None),
)  # fmt: skip
def test_masked_entries_never_change_loss_or_gradient(
    x: Tokens, mode: AggregationMode, level: RatioLevel, clip: Clip
) -> None:
    base_loss, base_grad = _loss_and_grad(x, mode, level, clip)
    junk = torch.where(x.mask, 0.0, 1e4)
    garbage = Tokens(
        torch.where(x.mask, x.logprobs, -junk),
        torch.where(x.mask, x.old, junk),
        torch.where(x.mask, x.adv, torch.tensor(float("nan"), dtype=torch.float64)),
        x.mask,
    )
    loss, grad = _loss_and_grad(garbage, mode, level, clip)
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, base_loss, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(grad, base_grad, atol=1e-12, rtol=1e-12)
    assert torch.equal(grad[~x.mask], torch.zeros_like(grad[~x.mask]))


@FAST
@given(token_batches(), CLIPS)
def test_gradient_is_zero_exactly_where_a_clip_is_active(x: Tokens, clip: Clip) -> None:
    lo, hi, c = clip
    high = lo if hi is None else hi
    _, grad = _loss_and_grad(x, "token-mean", "token", clip)
    ratio = torch.exp(x.logprobs - x.old)
    clipped = ((x.adv > 0) & (ratio > 1 + high)) | ((x.adv < 0) & (ratio < 1 - lo))
    if c is not None:
        clipped |= (x.adv < 0) & (ratio > c)
    outside = x.mask & clipped
    assert torch.equal(grad[outside], torch.zeros_like(grad[outside]))
    inside = x.mask & ~clipped & (x.adv != 0)
    n = x.mask.sum().clamp(min=1)
    # Inside the trust region the token-mean gradient is -Â·r / N.
    torch.testing.assert_close(grad[inside], (-x.adv * ratio / n)[inside], atol=1e-12, rtol=1e-9)


def paper_gspo_objective(
    x: Tokens, lo: float, hi: float, seq_adv: torch.Tensor, lp: torch.Tensor
) -> torch.Tensor:
    """GSPO eq. (5) with s_i of eq. (7), one sequence at a time (differentiable)."""
    terms: list[torch.Tensor] = []
    for i in range(lp.shape[0]):
        m = x.mask[i]
        if not bool(m.any()):
            continue
        s = torch.exp((lp[i][m] - x.old[i][m]).mean())
        a = seq_adv[i]
        terms.append(-torch.minimum(s * a, s.clamp(1 - lo, 1 + hi) * a))
    return torch.stack(terms).mean() if terms else torch.zeros((), dtype=torch.float64)


@FAST
@given(token_batches(), st.sampled_from([(0.2, 0.2), (3e-4, 4e-4), (0.05, 0.1)]))
def test_sequence_level_loss_equals_gspo_objective_and_gradient(x: Tokens, eps: tuple[float, float]) -> None:
    lo, hi = eps
    seq_adv = x.adv[:, 0]
    lp = x.logprobs.clone().requires_grad_(True)
    per_token = clipped_surrogate_loss(
        lp, x.old, seq_adv, x.mask, eps_low=lo, eps_high=hi, ratio_level="sequence"
    )
    ours = aggregate_loss(per_token, x.mask, mode="seq-mean-token-mean")
    (g_ours,) = torch.autograd.grad(ours, lp, allow_unused=True)
    lp2 = x.logprobs.clone().requires_grad_(True)
    ref = paper_gspo_objective(x, lo, hi, seq_adv, lp2)
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=1e-12)
    if ref.requires_grad:
        (g_ref,) = torch.autograd.grad(ref, lp2, materialize_grads=True)
        torch.testing.assert_close(g_ours, g_ref, atol=1e-12, rtol=1e-9)


@FAST
@given(token_batches())
def test_is_weights_scale_each_token_loss(x: Tokens) -> None:
    w = torch.rand(x.logprobs.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 2
    plain = clipped_surrogate_loss(x.logprobs, x.old, x.adv, x.mask)
    weighted = clipped_surrogate_loss(x.logprobs, x.old, x.adv, x.mask, is_weights=w)
    torch.testing.assert_close(weighted, plain * torch.where(x.mask, w, 0.0))


def test_per_sequence_advantages_broadcast_over_tokens() -> None:
    lp = torch.log(torch.full((2, 3), 0.5, dtype=torch.float64))
    mask = torch.ones(2, 3, dtype=torch.bool)
    seq = clipped_surrogate_loss(lp, lp, torch.tensor([1.0, -2.0], dtype=torch.float64), mask)
    assert tolist_2d(seq) == [[-1.0] * 3, [2.0] * 3]
    with pytest.raises(ShapeError, match="advantages"):
        clipped_surrogate_loss(lp, lp, torch.zeros(3, dtype=torch.float64), mask)


def test_bad_clip_arguments_raise() -> None:
    lp = torch.zeros(1, 2)
    m = torch.ones(1, 2)
    with pytest.raises(ArgumentError, match="dual_clip"):
        clipped_surrogate_loss(lp, lp, lp, m, dual_clip=1.0)
    with pytest.raises(ArgumentError, match="eps_low"):
        clipped_surrogate_loss(lp, lp, lp, m, eps_low=1.5)
    with pytest.raises(ShapeError, match="old_logprobs"):
        clipped_surrogate_loss(lp, torch.zeros(2, 1), lp, m)


def paper_value_loss(v: float, old: float, ret: float, clip: float | None) -> float:
    """OpenAI Baselines ppo2: ½ max((V - R)², (V_old + clip(V - V_old, ±ε) - R)²)."""
    plain = (v - ret) ** 2
    if clip is None:
        return 0.5 * plain
    vc = old + min(max(v - old, -clip), clip)
    return 0.5 * max(plain, (vc - ret) ** 2)


@FAST
@given(token_batches(), st.sampled_from([None, 0.0, 0.2, 1.0]))
def test_value_loss_equals_clipped_mse(x: Tokens, clip: float | None) -> None:
    values, old, returns = x.logprobs, x.old, x.adv
    got = value_loss(values, old, returns, x.mask, clip=clip)
    want = [
        [paper_value_loss(v, o, r, clip) if m else 0.0 for v, o, r, m in zip(*row, strict=True)]
        for row in zip(tolist_2d(values), tolist_2d(old), tolist_2d(returns), tolist_2d(x.mask), strict=True)
    ]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-12, rtol=1e-12)


def test_value_loss_ignores_masked_values_and_their_gradient() -> None:
    v = torch.tensor([[1.0, float("nan")]], dtype=torch.float64, requires_grad=True)
    loss = value_loss(v, torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1, 0]]), clip=0.1).sum()
    torch.autograd.backward(loss)
    assert v.grad is not None
    assert loss.item() == 0.5
    assert tolist_2d(v.grad) == [[1.0, 0.0]]


def test_entropy_loss_rewards_entropy_on_masked_tokens() -> None:
    h = torch.tensor([[0.5, 2.0]], dtype=torch.float64, requires_grad=True)
    loss = entropy_loss(h, torch.tensor([[True, False]]), coef=0.1)
    assert tolist_2d(loss) == [[-0.05, 0.0]]
    torch.autograd.backward(loss.sum())
    assert h.grad is not None
    assert tolist_2d(h.grad) == [[-0.1, 0.0]]
