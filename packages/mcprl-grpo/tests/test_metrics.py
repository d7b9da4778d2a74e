"""Metrics: definitions, namespaced keys, and finite values on empty masks."""

from __future__ import annotations

import math

import pytest
import torch
from grpo_testkit import tolist_1d
from hypothesis import given, settings
from hypothesis import strategies as st

from mcprl_grpo import clip_metrics, explained_variance, group_metrics, ratio_metrics, value_metrics

FAST = settings(max_examples=50, deadline=None)


@st.composite
def tokens(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    n = draw(st.integers(1, 16))
    lp = torch.tensor(draw(st.lists(st.floats(-5, 0), min_size=n, max_size=n)), dtype=torch.float64)
    dl = torch.tensor(draw(st.lists(st.floats(-1, 1), min_size=n, max_size=n)), dtype=torch.float64)
    adv = torch.tensor(draw(st.lists(st.floats(-2, 2), min_size=n, max_size=n)), dtype=torch.float64)
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    return lp, lp + dl, adv, mask


@FAST
@given(tokens(), st.sampled_from([None, 2.0]))
def test_clip_and_ratio_metrics_match_definitions(
    x: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], dual: float | None
) -> None:
    lp, old, adv, mask = x
    rows = [
        (math.exp(a - b), c)
        for a, b, c, m in zip(tolist_1d(lp), tolist_1d(old), tolist_1d(adv), tolist_1d(mask), strict=True)
        if m
    ]
    n = max(len(rows), 1)
    cm = clip_metrics(lp, old, adv, mask, eps_low=0.2, eps_high=0.28, dual_clip=dual)
    assert cm["clip/frac_low"] == pytest.approx(sum(a < 0 and r < 0.8 for r, a in rows) / n)
    assert cm["clip/frac_high"] == pytest.approx(sum(a > 0 and r > 1.28 for r, a in rows) / n)
    want_dual = sum(a < 0 and r > dual for r, a in rows) / n if dual else 0.0
    assert cm["clip/frac_dual"] == pytest.approx(want_dual)
    rm = ratio_metrics(lp, old, mask)
    ratios = [r for r, _ in rows]
    assert rm["ratio/mean"] == pytest.approx(sum(ratios) / n if ratios else 0.0)
    assert rm["ratio/min"] == pytest.approx(min(ratios) if ratios else 0.0)
    assert rm["ratio/max"] == pytest.approx(max(ratios) if ratios else 0.0)
    assert rm["kl/approx"] == pytest.approx(sum(r - 1 - math.log(r) for r in ratios) / n, abs=1e-12)
    assert all(math.isfinite(v) for v in (*cm.values(), *rm.values()))


def test_every_metric_is_finite_on_an_empty_mask() -> None:
    z = torch.zeros(2, 3)
    m = torch.zeros(2, 3, dtype=torch.bool)
    out = {**ratio_metrics(z, z, m), **clip_metrics(z, z, z, m), **value_metrics(z, z, m)}
    assert set(out) >= {
        "ratio/mean",
        "ratio/std",
        "clip/frac_low",
        "clip/frac_high",
        "kl/approx",
        "value/explained_var",
    }
    assert all(v == 0.0 for k, v in out.items() if k != "ratio/mean")


def test_group_metrics_count_zero_std_groups_among_non_empty_ones() -> None:
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 7.0, 7.0])
    g = torch.tensor([0, 0, 1, 1, 2, 2])
    out = group_metrics(r, g, valid=torch.tensor([True, True, True, True, False, False]))
    assert out["adv/zero_std_frac"] == 0.5
    assert out["adv/groups"] == 2.0
    assert out["reward/mean"] == 0.75
    assert out["episodes/valid_frac"] == pytest.approx(4 / 6)


def test_explained_variance_definition() -> None:
    ret = torch.tensor([1.0, 2.0, 3.0, 4.0, 99.0], dtype=torch.float64)
    mask = torch.tensor([1, 1, 1, 1, 0])
    assert explained_variance(ret, ret, mask) == 1.0
    assert explained_variance(torch.full((5,), 2.5, dtype=torch.float64), ret, mask) == pytest.approx(0.0)
    v = torch.tensor([1.5, 2.0, 2.5, 4.0, 0.0], dtype=torch.float64)
    resid = [1 - 1.5, 0.0, 0.5, 0.0]
    want = 1 - (sum((e - sum(resid) / 4) ** 2 for e in resid) / 3) / (5 / 3)
    assert explained_variance(v, ret, mask) == pytest.approx(want)
    assert explained_variance(v, torch.ones(5, dtype=torch.float64), mask) == 0.0
