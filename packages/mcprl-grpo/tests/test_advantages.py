"""Properties of the outcome advantage estimators (float64), incl. RELIABILITY.md scenario 13."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch
from grpo_testkit import tolist_1d, tolist_2d
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mcprl_grpo import (
    ArgumentError,
    DTypeError,
    Estimator,
    ShapeError,
    contiguous_group_ids,
    expand_to_tokens,
    filter_zero_variance,
    group_advantages,
    zero_variance_groups,
)

ESTIMATORS: tuple[Estimator, ...] = ("grpo", "dr_grpo", "rloo", "reinforce_pp")
FAST = settings(max_examples=40, deadline=None)
# Rewards on a grid of quarters: shifts and scales stay exact, so ties (zero-variance groups) are preserved.
REWARD = st.integers(-40, 40).map(lambda k: k / 4)


@dataclass
class Batch:
    rewards: list[float]
    group_ids: list[int]
    valid: list[bool]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            torch.tensor(self.rewards, dtype=torch.float64),
            torch.tensor(self.group_ids, dtype=torch.long),
            torch.tensor(self.valid, dtype=torch.bool),
        )


@st.composite
def batches(draw: st.DrawFn, *, all_valid: bool = False) -> Batch:
    sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=6))
    rewards: list[float] = []
    gids: list[int] = []
    valid: list[bool] = []
    for g, size in enumerate(sizes):
        pool = draw(st.sampled_from(["free", "binary", "constant"]))
        for _ in range(size):
            match pool:
                case "free":
                    rewards.append(draw(REWARD))
                case "binary":
                    rewards.append(draw(st.sampled_from([0.0, 1.0])))
                case _:
                    rewards.append(0.5)
            gids.append(g)
            valid.append(True if all_valid else draw(st.booleans() | st.just(True)))
    order = draw(st.permutations(list(range(len(rewards)))))
    return Batch([rewards[i] for i in order], [gids[i] for i in order], [valid[i] for i in order])


# -- direct transcriptions of the papers' equations (plain Python, one group at a time) -------------------


def _members(b: Batch) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, (g, ok) in enumerate(zip(b.group_ids, b.valid, strict=True)):
        if ok:
            out.setdefault(g, []).append(i)
    return out


def _centred(b: Batch, estimator: Estimator) -> list[float]:
    adv = [0.0] * len(b.rewards)
    for idx in _members(b).values():
        rs = [b.rewards[i] for i in idx]
        if max(rs) == min(rs):
            continue
        mu = statistics.fmean(rs)
        for i in idx:
            if estimator == "rloo":  # Ahmadian et al. 2024, eq. (5)
                others = [b.rewards[j] for j in idx if j != i]
                adv[i] = b.rewards[i] - statistics.fmean(others)
            else:
                adv[i] = b.rewards[i] - mu
    return adv


def paper_grpo(b: Batch, eps: float) -> list[float]:
    """DeepSeekMath §4.1.2: Â_i = (r_i - mean(r)) / std(r)."""
    adv = [0.0] * len(b.rewards)
    for idx in _members(b).values():
        rs = [b.rewards[i] for i in idx]
        if max(rs) == min(rs):
            continue
        mu, sd = statistics.fmean(rs), statistics.stdev(rs)
        for i in idx:
            adv[i] = (b.rewards[i] - mu) / (sd + eps)
    return adv


def paper_reinforce_pp(b: Batch, eps: float) -> list[float]:
    """REINFORCE++-baseline: A' = r - mean_group(r); A = (A' - mean_batch A') / std_batch A'."""
    centred = _centred(b, "grpo")
    vals = [centred[i] for i in range(len(centred)) if b.valid[i]]
    if len(vals) < 2:
        return [0.0] * len(centred)
    mu, sd = statistics.fmean(vals), statistics.stdev(vals)
    flat = {g for g, idx in _members(b).items() if len({b.rewards[i] for i in idx}) == 1}
    return [
        (centred[i] - mu) / (sd + eps) if b.valid[i] and b.group_ids[i] not in flat else 0.0
        for i in range(len(centred))
    ]


def _close(got: torch.Tensor, want: Sequence[float], tol: float = 1e-9) -> None:
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=tol, rtol=tol)


@FAST
@given(batches(), st.sampled_from([0.0, 1e-6]))
@example(Batch([1.0], [0], [True]), 1e-6)
@example(Batch([0.5, 0.5, 0.5], [0, 0, 0], [True, True, True]), 0.0)
@example(Batch([1.0, 0.0, 2.0], [0, 0, 0], [False, False, False]), 1e-6)
def test_grpo_equals_deepseekmath_equation(b: Batch, eps: float) -> None:
    r, g, v = b.tensors()
    _close(group_advantages(r, g, valid=v, estimator="grpo", eps=eps), paper_grpo(b, eps))


@FAST
@given(batches())
@example(Batch([1.0], [0], [True]))
@example(Batch([3.0, 1.0], [0, 0], [True, False]))
def test_dr_grpo_and_rloo_equal_their_equations(b: Batch) -> None:
    r, g, v = b.tensors()
    _close(group_advantages(r, g, valid=v, estimator="dr_grpo"), _centred(b, "dr_grpo"))
    _close(group_advantages(r, g, valid=v, estimator="rloo"), _centred(b, "rloo"))


@FAST
@given(batches(), st.sampled_from([0.0, 1e-6]))
@example(Batch([0.5, 0.5], [0, 0], [True, True]), 0.0)
def test_reinforce_pp_equals_batch_normalised_baseline(b: Batch, eps: float) -> None:
    r, g, v = b.tensors()
    _close(group_advantages(r, g, valid=v, estimator="reinforce_pp", eps=eps), paper_reinforce_pp(b, eps))


@FAST
@given(batches())
def test_batch_scale_divides_by_std_of_centred_advantages(b: Batch) -> None:
    r, g, v = b.tensors()
    got = group_advantages(r, g, valid=v, estimator="grpo", scale="batch", eps=0.0)
    want = group_advantages(r, g, valid=v, estimator="reinforce_pp", eps=0.0)
    _close(got, tolist_1d(want))


@FAST
@given(batches(), st.sampled_from(ESTIMATORS))
@example(Batch([1.0], [0], [True]), "grpo")
@example(Batch([2.0, 2.0, 2.0, 2.0], [0, 0, 0, 0], [True] * 4), "rloo")
def test_advantages_have_zero_mean_within_each_group(b: Batch, estimator: Estimator) -> None:
    r, g, v = b.tensors()
    adv = group_advantages(r, g, valid=v, estimator=estimator)
    sums = torch.zeros(int(g.max()) + 1, dtype=torch.float64).index_add_(0, g, adv)
    torch.testing.assert_close(sums, torch.zeros_like(sums), atol=1e-9, rtol=0)


@FAST
@given(batches(), st.sampled_from(ESTIMATORS), st.integers(-400, 400).map(lambda k: k / 4))
def test_advantages_are_shift_invariant(b: Batch, estimator: Estimator, shift: float) -> None:
    r, g, v = b.tensors()
    a = group_advantages(r, g, valid=v, estimator=estimator)
    shifted = group_advantages(r + shift, g, valid=v, estimator=estimator)
    torch.testing.assert_close(a, shifted, atol=1e-9, rtol=1e-9)


@FAST
@given(batches(), st.sampled_from(["grpo", "reinforce_pp"]), st.sampled_from([0.25, 2.0, 8.0, 1024.0]))
def test_std_scaled_advantages_are_scale_invariant(b: Batch, estimator: Estimator, factor: float) -> None:
    r, g, v = b.tensors()
    a = group_advantages(r, g, valid=v, estimator=estimator, eps=0.0)
    scaled = group_advantages(r * factor, g, valid=v, estimator=estimator, eps=0.0)
    torch.testing.assert_close(a, scaled, atol=1e-9, rtol=1e-9)


@FAST
@given(batches(), st.sampled_from(ESTIMATORS), st.randoms(use_true_random=False))
def test_advantages_are_permutation_equivariant(b: Batch, estimator: Estimator, rnd: random.Random) -> None:
    r, g, v = b.tensors()
    perm = list(range(len(b.rewards)))
    rnd.shuffle(perm)
    p = torch.tensor(perm)
    a = group_advantages(r, g, valid=v, estimator=estimator)
    permuted = group_advantages(r[p], g[p], valid=v[p], estimator=estimator)
    torch.testing.assert_close(permuted, a[p], atol=1e-9, rtol=1e-9)


@FAST
@given(st.integers(1, 16), st.sampled_from(ESTIMATORS), REWARD)
@example(1, "rloo", 0.0)
def test_constant_group_yields_exact_zero_never_nan(size: int, estimator: Estimator, value: float) -> None:
    r = torch.full((size,), value, dtype=torch.float64)
    adv = group_advantages(r, torch.zeros(size, dtype=torch.long), estimator=estimator, eps=0.0)
    assert torch.equal(adv, torch.zeros_like(adv))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_constant_group_of_repeating_decimal_is_exactly_zero(estimator: Estimator) -> None:
    # 0.1 * 3 / 3 != 0.1 in floating point: the mean alone would leave a residue.
    r = torch.full((3,), 0.1, dtype=torch.float64)
    adv = group_advantages(r, torch.zeros(3, dtype=torch.long), estimator=estimator)
    assert torch.equal(adv, torch.zeros(3, dtype=torch.float64))


@FAST
@given(batches(), st.sampled_from(ESTIMATORS))
@example(Batch([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0], [0] * 8, [True] * 7 + [False]), "grpo")
@example(Batch([1.0, 0.0, 5.0, 0.0], [0, 0, 1, 1], [True, True, False, False]), "reinforce_pp")
def test_invalid_episodes_are_removed_from_baselines(b: Batch, estimator: Estimator) -> None:
    """RELIABILITY.md scenario 13: a failed episode is masked out; the others' advantages ignore it."""
    r, g, v = b.tensors()
    poisoned = torch.where(v, r, torch.tensor(float("nan"), dtype=torch.float64))
    adv = group_advantages(poisoned, g, valid=v, estimator=estimator)
    assert torch.equal(adv[~v], torch.zeros_like(adv[~v]))
    without = group_advantages(r[v], g[v], estimator=estimator, num_groups=int(g.max()) + 1)
    torch.testing.assert_close(adv[v], without, atol=1e-9, rtol=1e-9)


def test_failed_episode_is_not_scored_as_reward_zero() -> None:
    r = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    g = torch.zeros(4, dtype=torch.long)
    masked = group_advantages(r, g, valid=torch.tensor([True, True, True, False]))
    assert torch.equal(masked, torch.zeros(4, dtype=torch.float64))  # the three survivors agree: no signal
    as_zero = group_advantages(r, g)
    assert bool((as_zero[:3] > 0).all())  # what treating the failure as reward 0 would have done


def test_all_invalid_group_gets_zero_and_leaves_other_groups_alone() -> None:
    r = torch.tensor([1.0, 0.0, 3.0, 4.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 1, 1])
    adv = group_advantages(r, g, valid=torch.tensor([True, True, False, False]))
    alone = group_advantages(r[:2], g[:2])
    torch.testing.assert_close(adv, torch.cat([alone, torch.zeros(2, dtype=torch.float64)]))


@FAST
@given(batches())
@example(Batch([1.0, 1.0, 2.0], [0, 0, 1], [True, True, False]))
def test_zero_variance_groups_and_filter_match_definition(b: Batch) -> None:
    r, g, v = b.tensors()
    k = int(g.max()) + 1
    members = _members(b)
    want = [g_ in members and len({b.rewards[i] for i in members[g_]}) == 1 for g_ in range(k)]
    assert tolist_1d(zero_variance_groups(r, g, valid=v)) == want
    keep = filter_zero_variance(r, g, valid=v)
    assert tolist_1d(keep) == [b.valid[i] and not want[b.group_ids[i]] for i in range(len(b.rewards))]


def test_zero_variance_tolerance_counts_near_ties() -> None:
    r = torch.tensor([1.0, 1.0 + 1e-9, 0.0, 1.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 1, 1])
    assert tolist_1d(zero_variance_groups(r, g)) == [False, False]
    assert tolist_1d(zero_variance_groups(r, g, atol=1e-6)) == [True, False]


def test_grid_layout_round_trips_through_contiguous_group_ids() -> None:
    grid = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    adv = group_advantages(grid.reshape(-1), contiguous_group_ids(2, 4), estimator="dr_grpo").reshape(2, 4)
    torch.testing.assert_close(adv, torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0] * 4], dtype=torch.float64))


def test_empty_batch_gives_empty_advantages() -> None:
    adv = group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long), num_groups=0)
    assert adv.shape == (0,)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_rewards_compute_in_float32(dtype: torch.dtype) -> None:
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=dtype)
    adv = group_advantages(r, torch.zeros(4, dtype=torch.long))
    assert adv.dtype == torch.float32
    assert math.isclose(float(adv[0]), 0.5 / statistics.stdev([1.0, 0.0, 0.0, 1.0]) * 1, rel_tol=1e-5)


def test_expand_to_tokens_puts_advantage_on_masked_tokens_only() -> None:
    mask = torch.tensor([[0, 1, 1], [1, 0, 0]])
    out = expand_to_tokens(torch.tensor([2.0, -1.0]), mask)
    assert tolist_2d(out) == [[0.0, 2.0, 2.0], [-1.0, 0.0, 0.0]]
    with pytest.raises(ShapeError, match="mask"):
        expand_to_tokens(torch.tensor([2.0, -1.0, 0.0]), mask)


def test_bad_inputs_raise_typed_errors_naming_the_tensor() -> None:
    r = torch.zeros(4)
    with pytest.raises(ShapeError, match=r"group_ids has shape \(3,\), expected \(4,\)"):
        group_advantages(r, torch.zeros(3, dtype=torch.long))
    with pytest.raises(DTypeError, match="group_ids"):
        group_advantages(r, torch.zeros(4))
    with pytest.raises(ShapeError, match="valid"):
        group_advantages(r, torch.zeros(4, dtype=torch.long), valid=torch.ones(5, dtype=torch.bool))
    with pytest.raises(ArgumentError, match="num_groups"):
        group_advantages(r, torch.tensor([0, 1, 2, 3]), num_groups=2)
    with pytest.raises(ShapeError, match="rewards"):
        group_advantages(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ArgumentError, match="eps"):
        group_advantages(r, torch.zeros(4, dtype=torch.long), eps=-1.0)


def test_expand_to_tokens_packed_layout_matches_padded() -> None:
    adv = torch.tensor([2.0, -1.0, 0.5])
    lengths = torch.tensor([2, 3, 1])
    padded_mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 0]]).bool()
    packed_mask = torch.tensor([1, 0, 1, 1, 0, 1]).bool()
    seq_ids = torch.arange(3).repeat_interleave(lengths)
    assert tolist_1d(expand_to_tokens(adv, packed_mask, seq_ids=seq_ids)) == [2.0, 0.0, -1.0, -1.0, 0.0, 0.5]
    assert tolist_1d(expand_to_tokens(adv, padded_mask)[padded_mask]) == [2.0, -1.0, -1.0, 0.5]
    with pytest.raises(ShapeError, match="advantages"):
        expand_to_tokens(adv[:2], packed_mask, seq_ids=seq_ids)
