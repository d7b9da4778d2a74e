"""Importance ratios: token (PPO), sequence (GSPO eq. 7), GSPO-token (eq. 13), TIS weights, mismatch metrics."""

from __future__ import annotations

import math

import torch
from grpo_testkit import tolist_1d
from hypothesis import given, settings
from hypothesis import strategies as st

from mcprl_grpo import (
    gspo_token_ratios,
    log_ratio,
    mismatch_metrics,
    sequence_ratios,
    tis_weights,
    token_ratios,
)

FAST = settings(max_examples=40, deadline=None)


def tensor_list_bool(mask: torch.Tensor) -> list[bool]:
    return [bool(v) for v in mask.flatten().unbind()]


@st.composite
def pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    n = b * t
    lp = draw(st.lists(st.floats(-8, 0), min_size=n, max_size=n))
    delta = draw(st.lists(st.floats(-2, 2), min_size=n, max_size=n))
    mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    lpt = torch.tensor(lp, dtype=torch.float64).reshape(b, t)
    return lpt, lpt + torch.tensor(delta, dtype=torch.float64).reshape(b, t), torch.tensor(mask).reshape(b, t)


@FAST
@given(pairs())
def test_token_ratio_is_probability_ratio_and_one_outside_mask(
    x: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    lp, old, mask = x
    r = token_ratios(lp, old, mask)
    want = torch.where(mask, torch.exp(lp) / torch.exp(old), 1.0)
    torch.testing.assert_close(r, want, atol=1e-12, rtol=1e-10)
    assert torch.equal(log_ratio(lp, old, mask)[~mask], torch.zeros_like(lp[~mask]))


@FAST
@given(pairs())
def test_sequence_ratio_equals_gspo_length_normalised_likelihood_ratio(
    x: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    lp, old, mask = x
    got = sequence_ratios(lp, old, mask)
    want: list[float] = []
    for i in range(lp.shape[0]):
        n = int(mask[i].sum())
        p_new = math.prod(math.exp(v) for v in tolist_1d(lp[i][mask[i]]))
        p_old = math.prod(math.exp(v) for v in tolist_1d(old[i][mask[i]]))
        want.append((p_new / p_old) ** (1 / n) if n else 1.0)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-10, rtol=1e-8)


@FAST
@given(pairs())
def test_gspo_token_ratio_has_sequence_value_and_per_token_gradient(
    x: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    lp, old, mask = x
    lp = lp.clone().requires_grad_(True)
    r = gspo_token_ratios(lp, old, mask)
    seq = sequence_ratios(lp, old, mask).detach()
    torch.testing.assert_close(r.detach(), torch.where(mask, seq[:, None].expand_as(lp), 1.0))
    weights = torch.arange(lp.numel(), dtype=torch.float64).reshape(lp.shape)
    (grad,) = torch.autograd.grad((r * weights).sum(), lp)
    torch.testing.assert_close(grad, torch.where(mask, seq[:, None] * weights, 0.0))


@FAST
@given(pairs())
def test_packed_sequence_ratios_match_padded(x: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    lp, old, mask = x
    b = lp.shape[0]
    seq_ids = torch.arange(b).repeat_interleave(mask.sum(dim=1))
    ones = torch.ones(int(mask.sum()), dtype=torch.bool)
    packed = sequence_ratios(lp[mask], old[mask], ones, seq_ids=seq_ids)
    padded = sequence_ratios(lp, old, mask)[: packed.shape[0]]
    torch.testing.assert_close(packed, padded)


@FAST
@given(pairs(), st.sampled_from([1.0, 2.0, 5.0]))
def test_tis_weights_truncate_or_mask_above_the_cap(
    x: tuple[torch.Tensor, torch.Tensor, torch.Tensor], cap: float
) -> None:
    trainer, sampler, mask = x
    w = tis_weights(trainer, sampler, mask, cap=cap)
    raw = torch.exp(trainer - sampler)
    torch.testing.assert_close(w, torch.where(mask, raw.clamp(max=cap), 1.0))
    masked = tis_weights(trainer, sampler, mask, cap=cap, mode="mask")
    torch.testing.assert_close(masked, torch.where(mask, torch.where(raw <= cap, raw, 0.0), 1.0))
    seq = tis_weights(trainer, sampler, mask, cap=cap, level="sequence")
    per_seq = torch.exp(torch.where(mask, trainer - sampler, 0.0).sum(dim=1, keepdim=True)).clamp(max=cap)
    torch.testing.assert_close(seq, torch.where(mask, per_seq.expand_as(trainer), 1.0))
    assert not w.requires_grad


@FAST
@given(pairs(), st.sampled_from([1.5, 2.0, 8.0]))
def test_mismatch_metrics_match_a_per_token_transcription(
    x: tuple[torch.Tensor, torch.Tensor, torch.Tensor], cap: float
) -> None:
    trainer, sampler, mask = x
    got = mismatch_metrics(trainer, sampler, mask, cap=cap)
    pairs_ = [
        (t, s)
        for t, s, m in zip(
            tolist_1d(trainer.flatten()), tolist_1d(sampler.flatten()), tensor_list_bool(mask), strict=True
        )
        if m
    ]
    n = len(pairs_)
    diffs = [abs(t - s) for t, s in pairs_]
    # Schulman 2020 with the sampler as the sampling policy: ρ = π_trainer/π_sampler, k1 = -log ρ, k3 = ρ-1-log ρ.
    k1 = [s - t for t, s in pairs_]
    k3 = [math.exp(t - s) - 1 - (t - s) for t, s in pairs_]
    weights = [min(math.exp(t - s), cap) for t, s in pairs_]
    want = {
        "mismatch/logprob_abs_diff_mean": sum(diffs) / n if n else 0.0,
        "mismatch/logprob_abs_diff_max": max(diffs, default=0.0),
        "mismatch/kl_k1": sum(k1) / n if n else 0.0,
        "mismatch/kl_k3": sum(k3) / n if n else 0.0,
        "mismatch/tokens": float(n),
        "mismatch/tis_capped_frac": sum(math.exp(t - s) > cap for t, s in pairs_) / n if n else 0.0,
        "mismatch/tis_weight_mean": sum(weights) / n if n else 0.0,
    }
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-9), key


def test_mismatch_metrics_are_zero_when_trainer_and_sampler_agree() -> None:
    lp = torch.tensor([-0.5, -1.5, -3.0, -0.1])
    mask = torch.tensor([False, True, True, True])
    got = mismatch_metrics(lp, lp.clone(), mask)
    assert got == {
        "mismatch/logprob_abs_diff_mean": 0.0,
        "mismatch/logprob_abs_diff_max": 0.0,
        "mismatch/kl_k1": 0.0,
        "mismatch/kl_k3": 0.0,
        "mismatch/tokens": 3.0,
    }
